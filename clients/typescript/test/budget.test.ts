/**
 * The connection's write budget (`src/transport/budget.ts`): writes wait for room in the order
 * they asked, a write larger than the budget takes all of it, and room given back goes to the
 * first in line. (Under load, against a real server: `many_calls.test.ts`.)
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { WriteBudget } from "../src/transport/budget.js";

test("writes are granted in the order they asked, as room is given back", () => {
  const budget = new WriteBudget(100);
  const granted: string[] = [];
  budget.take(60, () => granted.push("a"));
  budget.take(60, () => granted.push("b")); // waits: 40 free
  budget.take(10, () => granted.push("c")); // waits behind b, though 10 would fit
  assert.deepEqual(granted, ["a"]);
  assert.equal(budget.taken, 60);
  budget.give(60);
  assert.deepEqual(granted, ["a", "b", "c"]);
  assert.equal(budget.taken, 70);
  budget.give(60);
  budget.give(10);
  assert.equal(budget.taken, 0);
});

test("a write larger than the whole budget takes all of it, then gives all of it back", () => {
  const budget = new WriteBudget(100);
  const granted: string[] = [];
  budget.take(250, () => granted.push("big"));
  budget.take(1, () => granted.push("small"));
  assert.deepEqual(granted, ["big"]);
  assert.equal(budget.taken, 100);
  budget.give(250);
  assert.deepEqual(granted, ["big", "small"]);
  assert.equal(budget.taken, 1);
});
