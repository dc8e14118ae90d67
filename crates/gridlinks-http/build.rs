//! Embeds the web console (`console/dist`, built by `npm run build` in `console/`, which
//! `make run` and `make test` do) into the binary: `$OUT_DIR/console.rs` lists every file
//! with its content type, its bytes and its gzip copy. Without a built console the list is
//! empty and `/` says how to build it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_none_or(|x| x != "gz") {
            out.push(p);
        }
    }
}

fn content_type(p: &Path) -> &'static str {
    match p.extension().and_then(|x| x.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("json") => "application/json",
        Some("woff2") => "font/woff2",
        _ => "application/octet-stream",
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let console = manifest.join("../../console");
    let dist = console.join("dist");
    // Watching dist once it exists; until then the console's sources (small without
    // node_modules), so a first build of the console is noticed.
    let watched = if dist.is_dir() { &dist } else { &console };
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", watched.display());
    let mut list = Vec::new();
    files(&dist, &mut list);
    list.sort();
    let mut code = String::from("/// The console's files.\npub static FILES: &[File] = &[\n");
    for p in &list {
        let rel = p.strip_prefix(&dist).expect("under dist").to_string_lossy().replace('\\', "/");
        let gz = PathBuf::from(format!("{}.gz", p.display()));
        let gz =
            if gz.is_file() { format!("Some(include_bytes!({:?}))", gz.display().to_string()) } else { "None".into() };
        let _ = writeln!(
            code,
            "    File {{ path: {:?}, content_type: {:?}, bytes: include_bytes!({:?}), gzip: {gz} }},",
            format!("/{rel}"),
            content_type(p),
            p.display().to_string()
        );
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("console.rs");
    std::fs::write(out, code).expect("OUT_DIR is writable");
}
