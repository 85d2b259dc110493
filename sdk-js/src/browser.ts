/**
 * The `<script>` build: defines `window.boxtrail` and starts itself from the tag's
 * `data-` attributes, e.g. `<script src="boxtrail.js" data-ingest-key="bti_..."
 * data-endpoint="https://logs.example.com" data-release="1.4.2"></script>`.
 */

import { fromDataset } from './script';
import { createSdk } from './sdk';

const sdk = createSdk();
(globalThis as any).boxtrail = sdk;
try {
  const d = (document.currentScript as HTMLScriptElement | null)?.dataset;
  if (d && d.ingestKey) sdk.init(fromDataset(d));
} catch {
  // no script tag (loaded as a module): init() by hand
}
