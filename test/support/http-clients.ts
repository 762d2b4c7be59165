import http from 'node:http';

/**
 * Opens requests that a test can abandon: each is sent at once, and `hangUp()` closes every socket
 * before an answer came, as a client that gave up (a closed tab, a proxy's timeout) does.
 */
export class AbandonedRequests {
  private readonly requests: http.ClientRequest[] = [];
  /** Status codes of the requests that were answered before they were abandoned. */
  readonly answered: number[] = [];

  constructor(private readonly port: number) {}

  send(method: string, path: string, count: number): void {
    for (let i = 0; i < count; i++) {
      // A fresh connection each (no agent): hanging up closes exactly this request's socket.
      const req = http.request({ host: '127.0.0.1', port: this.port, method, path, agent: false }, (res) => {
        this.answered.push(res.statusCode ?? 0);
        res.resume();
      });
      req.on('error', () => undefined);
      req.end();
      this.requests.push(req);
    }
  }

  hangUp(): void {
    for (const req of this.requests) req.destroy();
  }
}
