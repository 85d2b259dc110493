/** boxtrail browser SDK: `init({ingestKey, endpoint})`, then `log.info(...)`. */

import { createSdk } from './sdk';

export type { Attrs, ConsoleMethod, ErrorInfo, Level, LogEvent, Options, Scalar } from './types';
export type { Sdk } from './sdk';

export const { init, log, flush, setContext } = createSdk();
