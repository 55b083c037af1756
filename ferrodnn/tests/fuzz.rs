//! A mutation fuzzer over the check cases' graphs (issue 29, item 7): each case is serialized to
//! JSON, one to three random mutations are applied (a number replaced by a neighbour, zero, a
//! negative or a huge value; a string by another of the graph's strings; an array element or an
//! object key dropped or duplicated), and the mutant goes through what a user's file goes
//! through: deserialize, validate, plan and execute on both CPU engines (the fast one and the
//! reference) with random inputs, under `catch_unwind`. Every outcome must be `Ok` or an `Err`
//! with a message; a panic fails the test with the mutant's JSON.
//!
//! `FERRODNN_FUZZ_ITERS` (default 1500) and `FERRODNN_FUZZ_SEED` (default 1) choose the run;
//! the host memory and work limits are small for this process (256 MiB, 2^28 steps) so that no
//! mutant runs long. The coverage-guided targets of `fuzz/` share the pipeline, the limits and
//! the seeds (`ferrodnn::testing::fuzz`).

use ferrodnn::testing::fuzz::{graph_json, seed_graphs, set_limits};
use ferrodnn::testing::SplitMix64;
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// Uniform in [0, n).
fn below(rng: &mut SplitMix64, n: usize) -> usize {
    (rng.next_u64() % n.max(1) as u64) as usize
}

/// Every leaf path (object keys and array indices) of a JSON value, with the leaf.
fn leaves<'a>(v: &'a Value, path: &mut Vec<PathStep>, out: &mut Vec<(Vec<PathStep>, &'a Value)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                path.push(PathStep::Key(k.clone()));
                leaves(x, path, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                path.push(PathStep::Index(i));
                leaves(x, path, out);
                path.pop();
            }
        }
        _ => {}
    }
    out.push((path.clone(), v));
}

#[derive(Clone, Debug)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn at<'a>(v: &'a mut Value, path: &[PathStep]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, s| match s {
        PathStep::Key(k) => v.get_mut(k.as_str()),
        PathStep::Index(i) => v.get_mut(*i),
    })
}

/// One random mutation of `v`, in place.
fn mutate(v: &mut Value, rng: &mut SplitMix64, strings: &[String]) {
    let mut all = Vec::new();
    leaves(v, &mut Vec::new(), &mut all);
    let (path, leaf) = {
        let (p, l) = &all[below(rng, all.len())];
        (p.clone(), (*l).clone())
    };
    let Some(slot) = at(v, &path) else { return };
    match leaf {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            let choices = [x + 1.0, x - 1.0, 0.0, -1.0, 1.0, 2.0 * x, -x, (1u64 << 40) as f64, i64::MAX as f64, 0.5, 3.0, 7.0];
            let y = choices[below(rng, choices.len())];
            *slot = if y.fract() == 0.0 && y.abs() < 9.2e18 { Value::from(y as i64) } else { Value::from(y) };
        }
        Value::String(_) if !strings.is_empty() => *slot = Value::from(strings[below(rng, strings.len())].clone()),
        Value::Bool(b) => *slot = Value::from(!b),
        Value::Array(a) if !a.is_empty() => {
            let mut a = a.clone();
            let i = below(rng, a.len());
            if below(rng, 2) == 0 {
                a.remove(i);
            } else {
                let x = a[i].clone();
                a.insert(i, x);
            }
            *slot = Value::Array(a);
        }
        Value::Object(m) if !m.is_empty() => {
            let mut m = m.clone();
            let k = m.keys().nth(below(rng, m.len())).cloned().unwrap_or_default();
            m.remove(&k);
            *slot = Value::Object(m);
        }
        _ => *slot = Value::Null,
    }
}

/// Every string of a JSON value (the pool a string mutation draws from).
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(m) => m.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

#[test]
fn mutated_graphs_give_results_or_errors_never_panics() {
    set_limits();
    let iters: usize = std::env::var("FERRODNN_FUZZ_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(1500);
    let seed: u64 = std::env::var("FERRODNN_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let seeds: Vec<Value> = seed_graphs().into_iter().filter_map(|(_, text)| serde_json::from_str(&text).ok()).collect();
    assert!(seeds.len() > 500, "{} seed graphs", seeds.len());
    let mut pool = Vec::new();
    seeds.iter().for_each(|v| strings(v, &mut pool));
    pool.sort();
    pool.dedup();
    let mut rng = SplitMix64::new(seed);
    let (mut ok, mut errors, mut panics) = (0usize, 0usize, Vec::new());
    let start = Instant::now();
    for i in 0..iters {
        if start.elapsed() > Duration::from_secs(240) {
            break;
        }
        let mut v = seeds[below(&mut rng, seeds.len())].clone();
        for _ in 0..1 + below(&mut rng, 3) {
            mutate(&mut v, &mut rng, &pool);
        }
        let text = serde_json::to_string(&v).unwrap_or_default();
        match catch_unwind(AssertUnwindSafe(|| graph_json(&text))) {
            Ok(Ok(_)) => ok += 1,
            Ok(Err(e)) => {
                assert!(!e.to_string().trim().is_empty(), "mutant {i}: an error without a message");
                errors += 1;
            }
            Err(p) => {
                let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                panics.push(format!("mutant {i} (seed {seed}): {msg}\n{text}"));
            }
        }
    }
    eprintln!("fuzz: {ok} ran, {errors} errors, {} panics in {:.1} s", panics.len(), start.elapsed().as_secs_f64());
    assert!(panics.is_empty(), "{} panics; the first:\n{}", panics.len(), panics[0]);
    // The mutants reach execution as well as the checks (a fuzzer whose every mutant is refused
    // at parsing tests nothing past it).
    assert!(ok > 0 && errors > 0, "{ok} ran, {errors} errors");
}
