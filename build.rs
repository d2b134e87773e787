//! Builds the one pinned llama.cpp (shared libraries + the patched llama-server), generates the Rust
//! bindings of its C headers and the C header of kolm-rsd.
//!
//! Source of llama.cpp, in order: `KOLM_LLAMA_CPP_DIR` (a user's own tree, patched in place, idempotently),
//! else `vendor/llama.cpp`, extracted from the PyPI sdist named in `vendor/llama.cpp.lock` (downloaded with
//! pip into the cache, SHA-256 verified). Patches in `patches/` are applied in name order.
//!
//! The build tree lives in `<target>/llama.cpp/` so debug and release builds, the tests, the CLI and the plugin
//! all link one `libllama`/`libggml` (found through an rpath, no LD_LIBRARY_PATH needed).
//! `KOLM_LLAMA_BUILD_DIR` names another build tree (the fuzz and sanitizer scripts reuse the normal one).

use sha2::{Digest, Sha256};
use std::env;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());

    for p in ["build.rs", "vendor/llama.cpp.lock", "patches", "src/ffi", "cbindgen.toml"] {
        println!("cargo:rerun-if-changed={p}");
    }
    for v in ["KOLM_LLAMA_CPP_DIR", "KOLM_LLAMA_BUILD_DIR", "KOLM_RSD_CACHE", "KOLM_RSD_UPDATE_HEADER", "CFLAGS", "CXXFLAGS"] {
        println!("cargo:rerun-if-env-changed={v}");
    }

    let patches = list_patches(&manifest.join("patches"));
    let src = match env::var_os("KOLM_LLAMA_CPP_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            patch_in_place(&dir, &patches);
            dir
        }
        None => vendored_tree(&manifest, &patches),
    };

    // Builds for another target dir (cargo fuzz, sanitizers: `<target>/<triple>/...`) may point at the
    // normal build's tree instead of building llama.cpp a second time.
    // A GPU backend gets a tree of its own, so switching features does not rebuild the CPU one.
    let tree = if env::var_os("CARGO_FEATURE_VULKAN").is_some() { "llama.cpp-vulkan" } else { "llama.cpp" };
    let build = env::var_os("KOLM_LLAMA_BUILD_DIR").map(PathBuf::from).unwrap_or_else(|| target_dir(&out).join(tree));
    cmake_build(&src, &build);
    let bin = build.join("bin");

    println!("cargo:rustc-link-search=native={}", bin.display());
    for lib in ["llama", "ggml", "ggml-base"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", bin.display());
    // Crates that link this one (python/) read it as DEP_LLAMA_BIN: a link arg does not reach them.
    println!("cargo:bin={}", bin.display());
    println!("cargo:rustc-env=KOLM_LLAMA_BIN_DIR={}", bin.display());
    println!("cargo:rustc-env=KOLM_LLAMA_SRC_DIR={}", src.display());

    bindings(&src, &out);
    header(&manifest, &out);
}

/// `<target>/` from `<target>/<profile>/build/<pkg>/out`.
fn target_dir(out: &Path) -> PathBuf {
    out.ancestors().nth(4).expect("OUT_DIR has the usual depth").to_path_buf()
}

fn cache_dir() -> PathBuf {
    match env::var_os("KOLM_RSD_CACHE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env::var("HOME").expect("HOME is set")).join(".cache/kolm-rsd"),
    }
}

struct Lock {
    package: String,
    version: String,
    subdir: String,
    sha256: String,
}

fn read_lock(manifest: &Path) -> Lock {
    let text = fs::read_to_string(manifest.join("vendor/llama.cpp.lock")).expect("vendor/llama.cpp.lock");
    let get = |key: &str| {
        text.lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| panic!("vendor/llama.cpp.lock: missing `{key}`"))
    };
    Lock { package: get("package"), version: get("version"), subdir: get("subdir"), sha256: get("sha256") }
}

fn sha256_file(path: &Path) -> String {
    let mut f = fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn list_patches(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "patch"));
    v.sort();
    v
}

/// Identity of the patch set, so an edited patch re-extracts a pristine tree.
fn patch_stamp(patches: &[PathBuf]) -> String {
    patches
        .iter()
        .map(|p| format!("{} {}\n", p.file_name().unwrap().to_string_lossy(), sha256_file(p)))
        .collect()
}

fn vendored_tree(manifest: &Path, patches: &[PathBuf]) -> PathBuf {
    let lock = read_lock(manifest);
    let tree = manifest.join("vendor/llama.cpp");
    let stamp_path = tree.join(".kolm-rsd-stamp");
    let stamp = format!("{} {} {}\n{}", lock.package, lock.version, lock.sha256, patch_stamp(patches));
    if fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        return tree;
    }

    // Extract and patch a pristine copy, then sync it into the tree file by file: unchanged files keep
    // their mtimes, so editing one patch rebuilds only what it touches.
    let tarball = fetch_sdist(&lock);
    let staging = manifest.join("vendor/.extract");
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).unwrap();
    let file = fs::File::open(&tarball).unwrap();
    tar::Archive::new(flate2::read::GzDecoder::new(file))
        .unpack(&staging)
        .unwrap_or_else(|e| panic!("extracting {}: {e}", tarball.display()));
    let root = format!("{}-{}", lock.package.replace('-', "_"), lock.version);
    let fresh = staging.join(root).join(&lock.subdir);
    assert!(fresh.join("CMakeLists.txt").exists(), "{} has no {}", tarball.display(), lock.subdir);
    for p in patches {
        apply_patch(&fresh, p);
    }
    sync_tree(&fresh, &tree);
    let _ = fs::remove_dir_all(&staging);
    fs::write(&stamp_path, stamp).unwrap();
    tree
}

/// Makes `dst` equal to `src`, writing only files whose bytes differ and removing files `src` lacks.
fn sync_tree(src: &Path, dst: &Path) {
    fs::create_dir_all(dst).unwrap();
    let mut keep = std::collections::HashSet::new();
    for entry in fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        keep.insert(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            if to.is_file() {
                fs::remove_file(&to).unwrap();
            }
            sync_tree(&from, &to);
        } else if fs::read(&to).ok() != Some(fs::read(&from).unwrap()) {
            if to.is_dir() {
                fs::remove_dir_all(&to).unwrap();
            }
            fs::copy(&from, &to).unwrap();
        }
    }
    for entry in fs::read_dir(dst).unwrap() {
        let entry = entry.unwrap();
        if !keep.contains(&entry.file_name()) && entry.file_name() != ".kolm-rsd-stamp" {
            let p = entry.path();
            if p.is_dir() {
                fs::remove_dir_all(&p).unwrap();
            } else {
                fs::remove_file(&p).unwrap();
            }
        }
    }
}

fn fetch_sdist(lock: &Lock) -> PathBuf {
    let dir = cache_dir().join("dl");
    fs::create_dir_all(&dir).unwrap();
    let name = format!("{}-{}.tar.gz", lock.package.replace('-', "_"), lock.version);
    let file = dir.join(&name);
    if !file.exists() || sha256_file(&file) != lock.sha256 {
        // pip writes into a directory of this build's own, and the sdist is renamed into the cache whole: another
        // build fetching at the same time (a second checkout, the Python package's) never reads a half-copied file.
        let staging = dir.join(format!(".{name}.{}.partial", std::process::id()));
        let spec = format!("{}=={}", lock.package, lock.version);
        let status = Command::new(python())
            // Only this package as source; its build backend (needed to read the sdist's metadata) comes
            // as a wheel into pip's isolated build environment, so nothing has to be installed beforehand.
            .args(["-m", "pip", "download", "--no-deps", "--no-binary", &lock.package, "-q"])
            .arg(&spec)
            .arg("-d")
            .arg(&staging)
            .status()
            .unwrap_or_else(|e| panic!("running pip to fetch {spec}: {e}"));
        assert!(status.success(), "pip download {spec} failed");
        let fetched = staging.join(&name);
        fs::rename(&fetched, &file).unwrap_or_else(|e| panic!("moving {} to {}: {e}", fetched.display(), file.display()));
        let _ = fs::remove_dir_all(&staging);
    }
    let got = sha256_file(&file);
    assert!(got == lock.sha256, "{}: SHA-256 {got} does not match the lock {}", file.display(), lock.sha256);
    file
}

fn python() -> String {
    env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn patch_cmd(tree: &Path, patch: &Path, extra: &[&str]) -> std::process::Output {
    Command::new("patch")
        .current_dir(tree)
        .args(["-p1", "--batch", "--silent"])
        .args(extra)
        .arg("-i")
        .arg(patch)
        .output()
        .unwrap_or_else(|e| panic!("running `patch` (install GNU patch): {e}"))
}

fn apply_patch(tree: &Path, patch: &Path) {
    let dry = patch_cmd(tree, patch, &["-N", "--dry-run"]);
    if !dry.status.success() {
        panic!(
            "patch {} does not apply to {}:\n{}{}",
            patch.display(),
            tree.display(),
            String::from_utf8_lossy(&dry.stdout),
            String::from_utf8_lossy(&dry.stderr)
        );
    }
    let done = patch_cmd(tree, patch, &["-N"]);
    assert!(done.status.success(), "applying {} to {} failed", patch.display(), tree.display());
}

/// A user's tree: skip patches that are already in, apply the others, fail clearly otherwise. A tree this
/// build script patched (another checkout's `vendor/llama.cpp`) is taken as its stamp says: later patches
/// change lines of earlier ones (0008 and 0009 of 0001's), so an earlier one no longer reverses alone.
fn patch_in_place(tree: &Path, patches: &[PathBuf]) {
    assert!(tree.join("CMakeLists.txt").exists(), "KOLM_LLAMA_CPP_DIR={} is not a llama.cpp tree", tree.display());
    if fs::read_to_string(tree.join(".kolm-rsd-stamp")).is_ok_and(|s| s.ends_with(&patch_stamp(patches))) {
        return;
    }
    for p in patches {
        if patch_cmd(tree, p, &["-R", "--dry-run"]).status.success() {
            continue;
        }
        apply_patch(tree, p);
    }
}

fn cmake_build(src: &Path, build: &Path) {
    let mut cfg = Command::new("cmake");
    cfg.arg("-S").arg(src).arg("-B").arg(build).args([
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
    ]);
    cfg.arg(format!("-DGGML_CUDA={}", on(env::var_os("CARGO_FEATURE_CUDA").is_some())));
    cfg.arg(format!("-DGGML_METAL={}", on(env::var_os("CARGO_FEATURE_METAL").is_some())));
    cfg.arg(format!("-DGGML_VULKAN={}", on(env::var_os("CARGO_FEATURE_VULKAN").is_some())));
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
        // ggml's AMX kernels take one path for a single token (AVX512-VNNI) and another, tiles, for several, so a
        // verify batch would not give the logits plain decoding gives (docs/batch-invariance.md); and where the
        // CPU has AMX, `-march=native` switches them on (on a Xeon with AMX here they also died of SIGILL at the
        // first prompt). Off, as on every CPU without AMX; explicit `-mno-` flags win over `-march` in any order.
        for (lang, var) in [("C", "CFLAGS"), ("CXX", "CXXFLAGS")] {
            let user = env::var(var).unwrap_or_default();
            cfg.arg(format!("-DCMAKE_{lang}_FLAGS={user} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"));
        }
    }
    if which("ccache") {
        cfg.args(["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]);
    }
    run(&mut cfg, "cmake configure of llama.cpp");

    let jobs = env::var("NUM_JOBS").unwrap_or_else(|_| "2".into());
    let mut b = Command::new("cmake");
    b.arg("--build").arg(build).args(["--config", "Release", "-j", &jobs, "--target"]);
    b.args(["llama", "llama-server", "llama-cli", "llama-batched-bench"]);
    run(&mut b, "cmake build of llama.cpp");
}

fn on(b: bool) -> &'static str {
    if b {
        "ON"
    } else {
        "OFF"
    }
}

fn which(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}

fn run(cmd: &mut Command, what: &str) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{what}: {e} (is cmake installed?)"));
    assert!(status.success(), "{what} failed ({status})");
}

fn bindings(src: &Path, out: &Path) {
    let inc = src.join("include");
    let ggml_inc = src.join("ggml/include");
    let header = out.join("llama_sys.h");
    fs::write(
        &header,
        "#include \"llama.h\"\n#include \"ggml.h\"\n#include \"ggml-backend.h\"\n#include \"ggml-cpu.h\"\n#include \"gguf.h\"\n",
    )
    .unwrap();
    bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_arg(format!("-I{}", inc.display()))
        .clang_arg(format!("-I{}", ggml_inc.display()))
        .allowlist_function("(llama|ggml|gguf)_.*")
        .allowlist_type("(llama|ggml|gguf)_.*")
        .allowlist_var("(LLAMA|GGML|GGUF)_.*")
        .prepend_enum_name(false)
        .layout_tests(false)
        .generate()
        .expect("bindgen over llama.h, ggml.h, ggml-backend.h, gguf.h")
        .write_to_file(out.join("llama_sys.rs"))
        .unwrap();
}

/// Generates kolm-rsd.h into OUT_DIR; the committed copy in include/ is checked against it by a test
/// (`KOLM_RSD_UPDATE_HEADER=1 cargo build` refreshes the committed one).
fn header(manifest: &Path, out: &Path) {
    let generated = out.join("kolm-rsd.h");
    let config = cbindgen::Config::from_file(manifest.join("cbindgen.toml")).expect("cbindgen.toml");
    // Only the ffi room speaks C: parse its files, not the whole crate.
    let mut builder = cbindgen::Builder::new().with_config(config);
    for f in ["error.rs", "api.rs", "plugin.rs"] {
        builder = builder.with_src(manifest.join("src/ffi").join(f));
    }
    builder
        .generate()
        .expect("cbindgen over src/ffi")
        .write_to_file(&generated);
    println!("cargo:rustc-env=KOLM_RSD_GENERATED_HEADER={}", generated.display());
    if env::var_os("KOLM_RSD_UPDATE_HEADER").is_some() {
        fs::copy(&generated, manifest.join("include/kolm-rsd.h")).unwrap();
    }
}
