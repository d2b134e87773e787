//! The extension links libllama dynamically, like the core. An rpath to the core's llama.cpp build tree
//! (`DEP_LLAMA_BIN`, from the core's build script) lets a build in place (`pip install ./python`, the
//! tests) find it; `maturin build` copies the libraries into the wheel and points the rpath there instead.

fn main() {
    let bin = std::env::var("DEP_LLAMA_BIN").expect("the kolm-rsd core's build script names its llama.cpp bin dir");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{bin}");
}
