import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { mkdirSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { chromium, type Browser, type Page } from 'playwright-core';
import { baseUrl, createShopApp } from '../../sample-app/shop.app.js';

/** Debian's chromium package; playwright-core drives it and never downloads a browser. */
const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const SCREENSHOTS = resolve(import.meta.dirname, '../../.tmp');

describe('the page at /, in headless Chromium', () => {
  let app: INestApplication;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    app = await createShopApp({}, false);
    await app.listen(0, '127.0.0.1');
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      // As root: no sandbox. The rest keep Chromium off a network it cannot reach. Playwright
      // gives every launch a new empty profile of its own.
      args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    });
    page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  }, 60_000);

  afterAll(async () => {
    await browser?.close();
    await app?.close();
  });

  it('lists the products with their stock', async () => {
    await page.goto(baseUrl(app));
    await expect(page.title()).resolves.toBe('Shop · nest-distributed-lock demo');
    const vinyl = page.locator('#products tr', { hasText: 'Limited-edition vinyl' });
    await vinyl.waitFor({ timeout: 10_000 });
    expect(await vinyl.locator('td').allTextContents()).toEqual([expect.any(String), 'Limited-edition vinyl', '100', '–']);
  });

  it('runs the demo from its button and shows each endpoint\'s result as it comes in', async () => {
    await page.goto(baseUrl(app));
    await page.click('#run');
    // Results arrive one endpoint at a time: the unsafe card is filled while the others still run.
    await page.locator('.card[data-endpoint="unsafe"].bad, .card[data-endpoint="unsafe"].good').waitFor({ timeout: 30_000 });
    await page.locator('#status[data-state="done"]').waitFor({ timeout: 60_000 });

    const field = (endpoint: string, name: string) => page.locator(`.card[data-endpoint="${endpoint}"] [data-field="${name}"]`).textContent();
    expect(Number(await field('unsafe', 'oversold'))).toBeGreaterThan(0);
    for (const endpoint of ['locked', 'atomic']) {
      expect(await field(endpoint, 'sold')).toBe('100');
      expect(await field(endpoint, 'stockLeft')).toBe('0');
      expect(await field(endpoint, 'oversold')).toBe('0');
      await expect(page.locator(`.card[data-endpoint="${endpoint}"]`).getAttribute('class')).resolves.toContain('good');
    }
    await expect(page.locator('.card[data-endpoint="unsafe"]').getAttribute('class')).resolves.toContain('bad');
    // The demo's products are in the list now, sold out.
    await page.locator('#products tr', { hasText: '· locked' }).waitFor({ timeout: 10_000 });

    mkdirSync(SCREENSHOTS, { recursive: true });
    const screenshot = join(SCREENSHOTS, 'shop-page.png');
    await page.screenshot({ path: screenshot, fullPage: true });
    expect(statSync(screenshot).size).toBeGreaterThan(10_000);
  }, 90_000);
});
