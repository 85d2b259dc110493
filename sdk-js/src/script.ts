/** Options from a script tag's `data-*` attributes (`data-ingest-key`, `data-batch-size`, ...). */

import { DEFAULTS } from './sdk';
import type { Options } from './types';

/** `true`/`false` become booleans, numeric options numbers, captureConsole a list. */
export function fromDataset(d: DOMStringMap): Options {
  const o: Record<string, unknown> = {};
  for (const k in d) {
    const v = d[k]!;
    o[k] = v == 'true' ? true : v == 'false' ? false : k in DEFAULTS ? +v
      : k == 'captureConsole' ? v.split(/\s*,\s*/) : v;
  }
  return o as unknown as Options;
}
