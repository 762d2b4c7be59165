import { chromium, type Browser } from 'playwright-core';

/**
 * Debian's chromium package (or CHROMIUM_PATH), headless; playwright-core drives it and never
 * downloads a browser. As root: no sandbox. The other flags keep Chromium off a network it cannot
 * reach. Playwright gives every launch a new empty profile of its own.
 */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium',
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}
