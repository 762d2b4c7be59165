import { Injectable } from '@nestjs/common';
import { Locked, LockService } from 'nest-distributed-lock';
import { OutOfStockException, ProductNotFoundException, StaleFencingTokenException, StockLimitException } from './products.errors.js';
import { PriceListService } from './price-list.service.js';
import { MAX_STOCK, ProductsRepository, type Endpoint, type OrderPrice, type Product } from './products.repository.js';

export interface Purchase {
  orderId: number;
  productId: number;
  quantity: number;
  endpoint: Endpoint;
  /** Stock right after this sale, as this request saw it. */
  stockLeft: number;
  /** The lock's fencing token that wrote the sale (locked endpoint only). */
  fencingToken?: number;
  /** What each item cost, from which version of the price list (locked endpoint; null before the first rebuild). */
  price?: OrderPrice | null;
}

/**
 * Lock waits are long on purpose: in the demo 500 buyers queue for one product, and a buyer that
 * gives up waiting would be a 409 "busy", not a sale, which would hide what the demo shows.
 */
const PRODUCT_LOCK_WAIT_MS = 30_000;

@Injectable()
export class ProductsService {
  constructor(
    private readonly products: ProductsRepository,
    private readonly locks: LockService,
    private readonly priceList: PriceListService,
  ) {}

  list(): Promise<Product[]> {
    return this.products.list();
  }

  async get(id: number): Promise<Product> {
    const product = await this.products.find(id);
    if (!product) throw new ProductNotFoundException(id);
    return product;
  }

  create(name: string, stock: number): Promise<Product> {
    return this.products.create(name, stock);
  }

  /**
   * Read-modify-write without a lock: read the stock, subtract in the program, write the result
   * back. Between the read and the write, other buyers read the same stock; each writes
   * "stock - 1" over the others, and every one of them gets an order. That is overselling.
   */
  async purchaseUnsafe(id: number, quantity: number): Promise<Purchase> {
    const stock = await this.readStock(id, quantity);
    const orderId = await this.products.writeStock(id, stock - quantity, quantity, 'unsafe');
    return { orderId, productId: id, quantity, endpoint: 'unsafe', stockLeft: stock - quantity };
  }

  /**
   * The same read-subtract-write, one buyer of this product at a time in every process. The
   * write carries the lock's fencing token, and the database refuses it when a newer holder has
   * written since: a holder paused past its lease cannot overwrite the next holder's sale.
   * (A check of `lock.signal` before writing would only narrow that window; the fence closes it.)
   */
  async purchase(id: number, quantity: number): Promise<Purchase> {
    await this.mustExist(id);
    // The price the buyer pays, read beside other readers of the price list (never half a
    // rebuild), and before the product's lock: a buyer queued for a busy product does not hold up
    // a rebuild.
    return this.sellUnderLock(id, quantity, (await this.priceList.quote(id)) ?? null);
  }

  @Locked('product:<id>', { wait: PRODUCT_LOCK_WAIT_MS })
  private async sellUnderLock(id: number, quantity: number, price: OrderPrice | null): Promise<Purchase> {
    const token = this.locks.current(`product:${id}`)?.fencingToken;
    const stock = await this.readStock(id, quantity);
    if (token === undefined) {
      // A backend without fencing tokens (Redlock): the lock alone has to be enough.
      const orderId = await this.products.writeStock(id, stock - quantity, quantity, 'locked', price ?? undefined);
      return { orderId, productId: id, quantity, endpoint: 'locked', stockLeft: stock - quantity, price };
    }
    const orderId = await this.products.writeStockFenced(id, stock - quantity, quantity, token, price ?? undefined);
    if (orderId === undefined) throw new StaleFencingTokenException(id, token, (await this.products.find(id))?.lastToken);
    return { orderId, productId: id, quantity, endpoint: 'locked', stockLeft: stock - quantity, fencingToken: token, price };
  }

  /** No lock, one statement: the database decrements and refuses below zero. */
  async purchaseAtomic(id: number, quantity: number): Promise<Purchase> {
    const sold = await this.products.decrementStock(id, quantity);
    if (!sold) {
      const product = await this.get(id);
      throw new OutOfStockException(id, product.stock, quantity);
    }
    return { orderId: sold.orderId, productId: id, quantity, endpoint: 'atomic', stockLeft: sold.stock };
  }

  /**
   * Under the same lock as locked sales: a locked sale writes back a count it read, so any other
   * writer of `stock` that skipped the lock would be overwritten by it.
   */
  async restock(id: number, quantity: number): Promise<Product> {
    await this.mustExist(id);
    return this.addStockUnderLock(id, quantity);
  }

  @Locked('product:<id>', { wait: PRODUCT_LOCK_WAIT_MS })
  private async addStockUnderLock(id: number, quantity: number): Promise<Product> {
    const token = this.locks.current(`product:${id}`)?.fencingToken;
    const product = await this.products.addStockFenced(id, quantity, token);
    if (product) return product;
    // Refused: either the stock would leave its column's range, or a newer holder wrote since.
    const current = await this.get(id);
    if (current.stock > MAX_STOCK - quantity) throw new StockLimitException(id, current.stock, quantity, MAX_STOCK);
    throw new StaleFencingTokenException(id, token!, current.lastToken);
  }

  /**
   * Before the lock, not under it: a request for a product that does not exist must cost the lock
   * backend nothing. Each lock taken is a round trip to Redis, and leaves a fencing counter there
   * for a lease (30 s by default): requests for random ids would each add a key. Products are
   * never deleted, so one that exists now still exists under the lock.
   */
  private async mustExist(id: number): Promise<void> {
    await this.get(id);
  }

  private async readStock(id: number, quantity: number): Promise<number> {
    const stock = await this.products.readStock(id);
    if (stock === undefined) throw new ProductNotFoundException(id);
    if (stock < quantity) throw new OutOfStockException(id, stock, quantity);
    return stock;
  }
}
