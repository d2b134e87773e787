//! `kolm-rsd`: the command line of kolm-rsd.

mod cli;

fn main() {
    std::process::exit(cli::run());
}
