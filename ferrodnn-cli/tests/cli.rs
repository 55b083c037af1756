//! The `ferrodnn` binary on hostile input: graph files it must refuse with a message (never an
//! abort, a panic or a signal; the hostile-input corpus of `ferrodnn/tests/hostile/` among them), a
//! closed standard output, and Ctrl-C during a long run.

use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::graph::ops::resample::{ResampleAttrs, ResampleMode};
use ferrodnn::{DataType, Graph, TensorDesc};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

const F: DataType = DataType::F32;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrodnn"));
    // Fixed limits, whatever the machine: 4 GiB of host memory, the default work bound.
    c.env("FERRODNN_MAX_HOST_BYTES", "4G").env_remove("FERRODNN_CPU_MAX_WORK").env("RUST_BACKTRACE", "0");
    c
}

/// A scratch folder of this test binary's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrodnn-cli-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// x -> op -> y, as JSON (not validated: the CLI must do that).
fn unary_json(x: TensorDesc, mode: PointwiseMode) -> String {
    let mut g = Graph::new("g").io_data_type(F);
    let x = g.tensor(x);
    let y = g.pointwise(mode, &[x]);
    g.named("op");
    g.set_output(y);
    g.to_json().unwrap()
}

fn relu() -> PointwiseMode {
    PointwiseMode::Relu { lower_clip: None, upper_clip: None, negative_slope: None }
}

fn run(path: &Path) -> Output {
    bin().arg("run").arg(path).args(["--engine", "cpu"]).output().unwrap()
}

/// What is wrong with `out` as a refusal: it must have a non-zero status (not an abort's 134, a
/// panic's 101 or a signal) and the message on stderr, naming what it should, with no panic text.
fn refusal_fault(out: &Output, what: &str, want: &[&str]) -> Option<String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    let fault = if code.is_none() {
        format!("ended by a signal ({:?})", out.status)
    } else if matches!(code, Some(0 | 101 | 134)) {
        format!("exit status {code:?}")
    } else if stderr.contains("panicked") || stderr.contains("memory allocation") {
        "a panic or an abort".into()
    } else if !stderr.starts_with("error: ") {
        "stderr does not start with the error".into()
    } else {
        format!("stderr lacks `{}`", want.iter().find(|w| !stderr.contains(*w))?)
    };
    Some(format!("{what}: {fault}; stderr: {stderr}"))
}

fn expect_refused(out: &Output, what: &str, want: &[&str]) {
    if let Some(fault) = refusal_fault(out, what, want) {
        panic!("{fault}");
    }
}

#[test]
fn run_refuses_hostile_graph_files_with_a_message() {
    let dir = scratch("run");
    let good = unary_json(TensorDesc::new("x", &[2, 3], F), relu());
    // Not a file of text at all, and no file (the corpus below has only text).
    let bin_file = dir.join("binary.json");
    std::fs::write(&bin_file, [0xff, 0xfe, 0x00, 0x9f]).unwrap();
    expect_refused(&run(&bin_file), "binary file", &["cannot read"]);
    expect_refused(&run(&dir.join("missing.json")), "missing file", &["cannot read"]);
    // The good graph runs.
    let ok = run(&write(&dir, "good.json", &good));
    assert!(ok.status.success(), "good graph: {}", String::from_utf8_lossy(&ok.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every graph file of the hostile-input corpus (`ferrodnn/tests/hostile/`, written from the
/// cases of `ferrodnn/tests/hostile.rs`; `expected.json` lists the words each error must
/// contain), one process each.
#[test]
fn run_refuses_every_file_of_the_hostile_corpus() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../ferrodnn/tests/hostile"));
    let index: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    assert!(index.len() >= 150, "the corpus has {} files", index.len());
    let start = Instant::now();
    let mut faults = Vec::new();
    for (stem, case) in &index {
        let want: Vec<&str> = case["want"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
        let what = format!("{stem}.json ({})", case["name"].as_str().unwrap());
        faults.extend(refusal_fault(&run(&dir.join(format!("{stem}.json"))), &what, &want));
    }
    eprintln!("{} graph files refused in {:.1} s", index.len(), start.elapsed().as_secs_f64());
    assert!(faults.is_empty(), "{} of {} files:\n{}", faults.len(), index.len(), faults.join("\n"));
}

/// `ferrodnn demo | head -0`, `ferrodnn run g.json | true`: a closed standard output ends the
/// command quietly.
#[test]
fn closed_stdout_is_not_a_panic() {
    let dir = scratch("pipe");
    let good = write(&dir, "good.json", &unary_json(TensorDesc::new("x", &[2, 3], F), relu()));
    for args in [vec!["demo".to_string()], vec!["run".to_string(), good.display().to_string(), "--engine".into(), "cpu".into()]] {
        let mut child = bin().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // Close the read end before the command writes anything.
        drop(child.stdout.take());
        let mut stderr = String::new();
        child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let status = child.wait().unwrap();
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        assert!(status.success() || status.code() == Some(141), "{args:?}: {status:?}; stderr: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C during a long CPU run cancels it after the current op: status 130 and a message.
#[cfg(unix)]
#[test]
fn ctrl_c_cancels_a_long_run() {
    let dir = scratch("ctrlc");
    // Eight poolings of 2^20 elements by 2^12 windows in a row: seconds each on one core.
    let mut g = Graph::new("long").io_data_type(F);
    let mut t = g.tensor(TensorDesc::new("x", &[1, 1, 1 << 20], F));
    for _ in 0..8 {
        t = g.resample(t, ResampleAttrs::uniform(ResampleMode::Max, 1, 1 << 12, 1, 2047));
    }
    g.set_output(t);
    let path = write(&dir, "long.json", &g.to_json().unwrap());
    let child = bin().arg("run").arg(&path).args(["--engine", "cpu"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let killed = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "stderr: {stderr}");
    assert!(stderr.contains("execution cancelled") && stderr.contains("graph \"long\""), "stderr: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
