//! JSON: every example graph round-trips; mutated, truncated and absurd JSON returns errors
//! and never panics.

use ferrodnn::engine::PlanPolicy;
use ferrodnn::testing::SplitMix64;
use ferrodnn::{DataType, Error, Graph, Handle, PlanDesc, TensorDesc};
use std::path::PathBuf;

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn example_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(examples_dir()).expect("examples/ exists").filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
    files.sort();
    files
}

#[test]
fn every_example_round_trips() {
    let files = example_files();
    assert!(files.len() >= 5, "expected at least 5 example graphs, found {}", files.len());
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let g = Graph::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let again = Graph::from_json(&g.to_json().unwrap()).unwrap();
        assert_eq!(g, again, "{}", path.display());
        assert_eq!(g.key(), again.key(), "{}", path.display());
    }
}

#[test]
fn every_example_runs_on_the_cpu() {
    for path in example_files() {
        let g = Graph::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let inputs = ferrodnn::testing::random_inputs(&g, 7);
        let outs = ferrodnn::testing::execute_dense(&Handle::cpu(), &g, &inputs, &PlanPolicy::default()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!outs.is_empty(), "{} has no outputs", path.display());
        for (id, nd) in outs {
            assert!(nd.data.iter().all(|v| v.is_finite()), "{}: output {} has non-finite values", path.display(), g.desc(id).name);
        }
    }
}

fn small_graph() -> Graph {
    let mut g = Graph::new("small").io_data_type(DataType::F32);
    let x = g.tensor(TensorDesc::new("x", &[2, 3], DataType::F32));
    let b = g.tensor(TensorDesc::new("b", &[1, 3], DataType::F32));
    let s = g.scalar("s", 0.5);
    let y = g.bias(x, b);
    let y = g.scale(y, s);
    let y = g.relu(y);
    g.set_output(y);
    g.validate().unwrap();
    g
}

#[test]
fn graph_key_is_stable_and_sensitive() {
    let g = small_graph();
    assert_eq!(g.key(), small_graph().key());
    let mut renamed = g.clone();
    renamed.name = "other".into();
    assert_eq!(g.key(), renamed.key(), "names do not change the computation");
    let mut changed = g.clone();
    changed.tensors[2].value = Some(0.25);
    assert_ne!(g.key(), changed.key());
}

#[test]
fn truncated_json_is_an_error() {
    let text = small_graph().to_json().unwrap();
    for cut in 0..text.len() {
        if !text.is_char_boundary(cut) {
            continue;
        }
        assert!(Graph::from_json(&text[..cut]).is_err(), "truncation at {cut} parsed");
    }
}

#[test]
fn mutated_json_never_panics() {
    let text = small_graph().to_json().unwrap();
    let bytes = text.as_bytes();
    let mut rng = SplitMix64::new(11);
    let replacements: &[&[u8]] = &[b"0", b"-1", b"9999999999999999999", b"\"", b"{", b"]", b"null", b"1e308", b"true", b"\"relu\"", b"[]"];
    let mut errors = 0;
    for _ in 0..3000 {
        let mut m = bytes.to_vec();
        let pos = (rng.next_u64() as usize) % m.len();
        match rng.next_u64() % 3 {
            0 => m[pos] = (rng.next_u64() % 128) as u8,
            1 => {
                let r = replacements[(rng.next_u64() as usize) % replacements.len()];
                let end = (pos + 1 + (rng.next_u64() as usize) % 8).min(m.len());
                m.splice(pos..end, r.iter().copied());
            }
            _ => {
                m.remove(pos);
            }
        }
        let Ok(s) = String::from_utf8(m) else { continue };
        if Graph::from_json(&s).is_err() {
            errors += 1;
        }
    }
    assert!(errors > 1000, "most mutations must be rejected, only {errors} were");
}

#[test]
fn absurd_sizes_are_refused_before_allocating() {
    let mut g: serde_json::Value = serde_json::from_str(&small_graph().to_json().unwrap()).unwrap();
    g["tensors"][0]["dims"] = serde_json::json!([1i64 << 40, 1i64 << 40]);
    g["tensors"][0]["strides"] = serde_json::json!([1i64 << 40, 1]);
    let err = Graph::from_json(&g.to_string()).unwrap_err();
    assert!(err.to_string().contains("overflows i64"), "{err}");

    let mut g: serde_json::Value = serde_json::from_str(&small_graph().to_json().unwrap()).unwrap();
    g["tensors"][0]["dims"] = serde_json::json!([1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    let err = Graph::from_json(&g.to_string()).unwrap_err();
    assert!(matches!(err, Error::Serialization(_)), "{err}");
    assert!(err.to_string().contains("rank 10"), "{err}");
}

#[test]
fn deep_nesting_and_garbage_are_errors() {
    let deep = "[".repeat(100_000);
    assert!(matches!(Graph::from_json(&deep), Err(Error::Serialization(_))));
    for junk in ["", "null", "42", "{}", "{\"nodes\": 5}", "{\"tensors\": [{\"dims\": \"x\"}]}", "{\"unknown\": 1}"] {
        assert!(Graph::from_json(junk).is_err(), "`{junk}` parsed");
    }
}

#[test]
fn unknown_op_and_field_are_errors() {
    let text = small_graph().to_json().unwrap();
    let bad_op = text.replacen("\"pointwise\"", "\"frobnicate\"", 1);
    let err = Graph::from_json(&bad_op).unwrap_err();
    assert!(err.to_string().contains("frobnicate"), "{err}");
    let bad_field = text.replacen("\"is_virtual\"", "\"is_virtuall\"", 1);
    assert!(Graph::from_json(&bad_field).is_err());
}

#[test]
fn plan_desc_round_trips_and_rebuilds() {
    let g = small_graph();
    let handle = Handle::cpu();
    let plan = handle.build_plans(&g, &PlanPolicy::default()).unwrap().remove(0);
    let json = plan.desc.to_json().unwrap();
    let desc = PlanDesc::from_json(&json).unwrap();
    assert_eq!(desc, plan.desc);
    let rebuilt = handle.plan_from_desc(&g, &desc).unwrap();
    assert_eq!(rebuilt.engine(), plan.engine());
    assert!(PlanDesc::from_json("{\"engine\": \"tpu\", \"knobs\": [], \"graph_key\": 1}").is_err());
    assert!(PlanDesc::from_json(&json[..json.len() - 2]).is_err());
}

/// Graphs that still validate after their numbers are mutated must run without panicking: the
/// CPU engine may return an error, never crash, on anything `validate` accepts.
#[test]
fn mutated_examples_that_validate_also_run() {
    let mut rng = SplitMix64::new(5);
    let mut ran = 0;
    for path in example_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        for _ in 0..60 {
            let mut v = value.clone();
            mutate_one_number(&mut v, &mut rng);
            let Ok(g) = Graph::from_json(&v.to_string()) else { continue };
            // Keep the run small: skip graphs whose tensors grew large.
            if g.tensors.iter().any(|t| t.element_count() > 1 << 16) {
                continue;
            }
            let inputs = ferrodnn::testing::random_inputs(&g, 3);
            let _ = ferrodnn::testing::execute_dense(&Handle::cpu(), &g, &inputs, &PlanPolicy::default());
            ran += 1;
        }
    }
    assert!(ran > 20, "only {ran} mutated graphs validated");
}

/// Replace one number somewhere in the JSON tree with a small or extreme value.
fn mutate_one_number(v: &mut serde_json::Value, rng: &mut SplitMix64) {
    fn count(v: &serde_json::Value) -> usize {
        match v {
            serde_json::Value::Number(_) => 1,
            serde_json::Value::Array(a) => a.iter().map(count).sum(),
            serde_json::Value::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    /// Replace the `k`-th number (in walk order); returns how many numbers were passed.
    fn replace(v: &mut serde_json::Value, k: usize, new: i64) -> usize {
        match v {
            serde_json::Value::Number(_) => {
                if k == 0 {
                    *v = serde_json::json!(new);
                }
                1
            }
            serde_json::Value::Array(a) => a.iter_mut().fold(0, |seen, x| seen + if seen <= k { replace(x, k - seen, new) } else { 0 }),
            serde_json::Value::Object(o) => o.values_mut().fold(0, |seen, x| seen + if seen <= k { replace(x, k - seen, new) } else { 0 }),
            _ => 0,
        }
    }
    let n = count(v);
    if n == 0 {
        return;
    }
    let choices = [0i64, 1, 2, 3, -1, 7, 1 << 20];
    let new = choices[(rng.next_u64() as usize) % choices.len()];
    replace(v, (rng.next_u64() as usize) % n, new);
}
