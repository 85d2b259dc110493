// The node peer: @jridgewell/trace-mapping on the same map and positions. Prints JSON.
import { readFileSync } from "node:fs";
import { TraceMap, originalPositionFor } from "@jridgewell/trace-mapping";

const [mapPath, positionsPath, rounds] = process.argv.slice(2);
const text = readFileSync(mapPath, "utf8");
const positions = JSON.parse(readFileSync(positionsPath, "utf8"));
let start = process.hrtime.bigint();
const map = new TraceMap(text);
originalPositionFor(map, { line: positions[0][0], column: positions[0][1] - 1 });
const parseMs = Number(process.hrtime.bigint() - start) / 1e6;
start = process.hrtime.bigint();
let found = 0;
for (let r = 0; r < Number(rounds); r++) {
  for (const [line, column] of positions) {
    if (originalPositionFor(map, { line, column: column - 1 }).source) found++;
  }
}
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
console.log(JSON.stringify({ parse_ms: parseMs, lookups_per_s: (positions.length * Number(rounds)) / seconds, found }));
