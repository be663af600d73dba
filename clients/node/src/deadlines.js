'use strict';

// The process's deadlines (docs/client-protocol.md, "Losses"): when each session and each grant
// with a lease of its own stops being confirmed. One min-heap for every Flock of the process and
// one unref'd timer at its earliest entry: at a deadline the timer runs what it was scheduled
// with (a grant marked lost, a session ended), whether or not any I/O failed.
//
// sweep() runs every entry whose time has come, at once. Flock calls it before it hands a grant
// to its caller, and Lock before it answers whether it is lost: a process paused past a deadline
// (SIGSTOP, a long GC, a frozen VM) may run an I/O callback before the overdue timer, and must
// not see a grant as held there, nor hand the lock to another caller before the loss is known.

const { now } = require('./protocol');

// setTimeout takes at most 2^31-1 ms; a later deadline is looked at again then.
const MAX_DELAY_MS = 2 ** 30;

const heap = [];
let timer = null;
let timerAt = Infinity;

/**
 * One deadline: `at` on the monotonic clock (protocol.now), `run` run once when it comes (or a
 * subclass's fire()). Scheduled by schedule(), or by move() (a subclass's, made at Infinity).
 */
class Deadline {
  constructor(at, run) {
    this.at = at;
    this.run = run;
    this.index = -1;
  }

  fire() {
    this.run();
  }

  /** Moves the deadline (later after a confirmation, or earlier). */
  move(at) {
    this.at = at;
    if (this.index < 0) insert(this);
    else {
      up(this.index);
      down(this.index);
    }
    arm();
  }

  cancel() {
    remove(this);
    arm();
  }

  get pending() {
    return this.index >= 0;
  }
}

function schedule(at, fire) {
  const deadline = new Deadline(at, fire);
  insert(deadline);
  arm();
  return deadline;
}

/** Runs every deadline that has come, earliest first. */
function sweep() {
  const t = now();
  while (heap.length > 0 && heap[0].at <= t) {
    const due = heap[0];
    remove(due);
    due.fire();
  }
  arm();
}

function insert(d) {
  d.index = heap.length;
  heap.push(d);
  up(d.index);
}

function remove(d) {
  const i = d.index;
  if (i < 0) return;
  d.index = -1;
  const last = heap.pop();
  if (last === d) return;
  heap[i] = last;
  last.index = i;
  up(i);
  down(last.index);
}

function swap(i, j) {
  const d = heap[i];
  heap[i] = heap[j];
  heap[j] = d;
  heap[i].index = i;
  d.index = j;
}

function up(i) {
  while (i > 0) {
    const parent = (i - 1) >> 1;
    if (heap[parent].at <= heap[i].at) return;
    swap(i, parent);
    i = parent;
  }
}

function down(i) {
  for (;;) {
    const left = 2 * i + 1;
    let least = i;
    if (left < heap.length && heap[left].at < heap[least].at) least = left;
    if (left + 1 < heap.length && heap[left + 1].at < heap[least].at) least = left + 1;
    if (least === i) return;
    swap(i, least);
    i = least;
  }
}

// The timer runs no later than the earliest deadline (it is set again only for an earlier one: a
// deadline cancelled or moved later leaves it, and it then finds nothing due and is set for the
// next); it never keeps the process alive.
function arm() {
  const at = heap.length > 0 ? heap[0].at : Infinity;
  if (at >= timerAt) return;
  clearTimeout(timer);
  timer = null;
  timerAt = at;
  if (at === Infinity) return;
  timer = setTimeout(onTimer, Math.min(MAX_DELAY_MS, Math.max(0, Math.ceil(at - now()))));
  timer.unref();
}

function onTimer() {
  timer = null;
  timerAt = Infinity;
  sweep();
}

module.exports = { Deadline, schedule, sweep };
