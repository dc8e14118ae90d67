//! `gridlinks-bench`: the GridLinks load generator. See the library documentation
//! (`src/lib.rs`) for what each subcommand measures.

use clap::Parser;

fn main() -> anyhow::Result<std::process::ExitCode> {
    gridlinks_bench::run(gridlinks_bench::cli::Cli::parse())
}
