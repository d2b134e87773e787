//! kolm-rsd: speculative decoding for llama.cpp that is nearly free.
//!
//! Pure rooms (no llama.cpp): `pack` (recipes.json), `hash` (stable window keys), `shape` (token
//! classes), `index` (lookup tables), `draft` (the combined drafter and break-even control), `align`
//! (deterministic tokens of K samples), `misslog`. Rooms over llama.cpp: `llama` (bindings + thin
//! safe layer), `vocab` (a model's token texts and tokenizer fingerprint), `teacher` (sampling runs),
//! `compile`, `engine` (what the C ABI drives), `ffi` (the C ABI and plugin entry points), `server` (a
//! real llama-server over HTTP), `load` (concurrent clients against it), `stress` (the reliability
//! harness), `fetch`, `workload`. `heap` counts this library's own memory; `quantile` is every report's median and p99.

pub mod align;
pub mod bench;
pub mod chart;
pub mod compile;
pub mod draft;
pub mod engine;
pub mod fetch;
pub mod ffi;
pub mod hash;
pub mod head;
pub mod heap;
pub mod index;
pub mod live;
pub mod llama;
pub mod load;
pub mod misslog;
pub mod pack;
pub mod quantile;
pub mod replay;
pub mod server;
pub mod shape;
pub mod shortlist;
pub mod stress;
pub mod teacher;
pub mod vocab;
pub mod windows;
pub mod workload;

#[global_allocator]
static HEAP: heap::Counting = heap::Counting;
