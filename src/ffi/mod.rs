//! The C ABI: `kolm_rsd_*` (include/kolm-rsd.h) and the llama.cpp plugin entry points
//! (`llama_spec_plugin_*`, docs/plugin-abi.md). Every extern function checks its pointers and runs behind
//! a panic boundary; errors are stable codes plus a per-thread message.

pub mod api;
pub mod error;
pub mod plugin;
