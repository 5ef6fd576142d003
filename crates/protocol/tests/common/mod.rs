//! Helpers shared by the integration tests.

use std::fs;
use std::path::{Path, PathBuf};

/// Every `*.example.json` under the bundled `spec/examples`, sorted, with
/// its text.
pub fn examples() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("spec/examples");
    let mut found = Vec::new();
    walk(&root, &mut found);
    found.sort();
    found
        .into_iter()
        .map(|path| {
            let text = fs::read_to_string(&path).expect("example is readable");
            (path, text)
        })
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("examples dir is readable") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.to_string_lossy().ends_with(".example.json") {
            out.push(path);
        }
    }
}
