'use strict';

// Owners and request IDs (docs/client-protocol.md, "Owners" and "Request IDs and resends"),
// made without drawing randomness each time: an acquire costs no entropy.

const { randomBytes } = require('node:crypto');

/** A UUID (version 4 form) from 16 random bytes. */
function uuidOf(bytes) {
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = bytes.toString('hex');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** This process's id: a random UUID made once. */
const PROCESS_ID = uuidOf(randomBytes(16));

let owners = 0;

/** A new owner of this process: `<process id>:<n>`, as every FLOCK client names one. */
const newOwner = () => `${PROCESS_ID}:${++owners}`;

// Request IDs: UUIDs whose first 24 hex digits are drawn at random (90 random bits) and whose
// last 8 count the requests, from 0x10000000 (so always 8 digits); after 0xf0000000 requests new
// random digits are drawn. Unique within the process, and across processes as the random part is.
let ridBase;
let rids = 0;

/** A fresh request ID (a UUID, version 4 form). */
function newRequestId() {
  if (rids === 0 || rids === 0xffffffff) {
    ridBase = uuidOf(randomBytes(16)).slice(0, 28);
    rids = 0x10000000;
  }
  return ridBase + (rids++).toString(16);
}

module.exports = { PROCESS_ID, newOwner, newRequestId };
