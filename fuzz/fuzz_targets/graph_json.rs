//! libFuzzer target: bytes as a graph file through deserialize, validate, plan and execute on
//! both CPU engines (`ferrodnn::testing::fuzz::graph_json`) under the fuzzers' small host
//! limits. An `Err` is a pass; a panic, abort, hang or an error without a message is a crash.
//!
//! With `FERRODNN_FUZZ_WRITE_SEEDS=DIR` it writes the seed corpus (the check cases' graphs)
//! into DIR/graph_json and the dictionary into DIR/graph_json.dict, then exits.
#![no_main]

use ferrodnn::testing::fuzz::{graph_json, set_limits, write_seeds};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fn init() {
    if let Some(dir) = std::env::var_os("FERRODNN_FUZZ_WRITE_SEEDS") {
        let dir = Path::new(&dir);
        match write_seeds(&dir.join("graph_json"), &dir.join("graph_json.dict")) {
            Ok((seeds, words)) => eprintln!("graph_json: {seeds} seeds, {words} dictionary words in {}", dir.display()),
            Err(e) => {
                eprintln!("graph_json: writing the seeds into {}: {e}", dir.display());
                std::process::exit(1);
            }
        }
        std::process::exit(0);
    }
    set_limits();
}

fuzz_target!(init: init(), |data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = graph_json(text) {
        assert!(!e.to_string().trim().is_empty(), "an error without a message");
    }
});
