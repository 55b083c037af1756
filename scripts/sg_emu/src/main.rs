//! Runs the CUDA engine's small-group convolution kernels (`engine/cuda/conv/smallgroup.rs`) on
//! the host and compares them with the reference engine, without a GPU: each launch's text (its
//! defines and templates, as the plan generates it) is compiled by g++ after `emu_prelude.h`
//! (the prelude's helpers and the CUDA vector and 16-bit types, with CUDA's qualifiers emptied),
//! each CUDA thread runs as a std::thread, `__syncthreads` is a barrier of the block's threads,
//! blocks run one after another (their dynamic shared memory one host array, poisoned with NaN
//! before each block, so a read of an element no thread of the block wrote shows). Buffers and
//! scratch are poisoned before the run, so an element no kernel writes shows as NaN. Each case
//! runs its plan's kernels, then the element-wise alternative its unit keeps for unaligned
//! buffers. Cases whose plan has other kernels (tensor-core GEMMs) are skipped.
//!
//! `cargo run --release -- [case name filter]` (needs g++ with C++20; `bench`: the benchmark
//! suite's small-group layers at batch 1, on the same kernel configurations); files go under
//! `$TMPDIR/sg_emu/`.

use ferrodnn::engine::cuda::kernel::{Arg, Grid, Launch};
use ferrodnn::engine::cuda::{planner, Options, Target};
use ferrodnn::engine::{Handle, PlanPolicy};
use ferrodnn::layout::{required_bytes, scatter, try_gather};
use ferrodnn::testing::{execute_dense, random_inputs, relative_error};
use ferrodnn::{DataType, Graph, Nd, TensorId};
use std::collections::HashMap;
use std::fmt::Write;

/// The launches of the plan (each with its node's scratch sizes), or of the units' unaligned
/// alternatives when `unaligned` (None when no unit has one).
fn launches(g: &Graph, unaligned: bool) -> Option<Vec<(Launch, Vec<usize>)>> {
    let units = planner::units(g, &Target::sm90a(), &Options::default(), true).unwrap();
    let mut out = Vec::new();
    let mut any = false;
    for u in &units {
        let k = match (&u.unaligned, unaligned) {
            (Some(a), true) => {
                any = true;
                &a.kernels
            }
            _ => &u.kernels,
        };
        for l in &k.launches {
            out.push((l.clone(), k.scratch.clone()));
        }
    }
    (!unaligned || any).then_some(out)
}

fn emulate(g: &Graph, inputs: &HashMap<TensorId, Nd>, launches: &[(Launch, Vec<usize>)], tag: &str) -> HashMap<TensorId, Nd> {
    let mut off = 0usize;
    let mut take = |n: usize| {
        let at = off;
        off += n.div_ceil(256).max(1) * 256;
        at
    };
    let mut tensor_at: HashMap<usize, usize> = HashMap::new();
    let mut init: Vec<(usize, Vec<u8>)> = Vec::new();
    for (i, t) in g.tensors.iter().enumerate() {
        let id = TensorId(i);
        let dt = g.resolved_data_type(id).unwrap_or(DataType::F32);
        let bytes = required_bytes(t, dt);
        let at = take(bytes);
        tensor_at.insert(i, at);
        let mut buf = vec![0xffu8; bytes];
        if let (true, Some(v)) = (t.is_pass_by_value, t.value) {
            buf = dt.encode(&[v]);
        } else if let Some(nd) = inputs.get(&id) {
            scatter(t, dt, nd, &mut buf);
        }
        init.push((at, buf));
    }
    // Scratch buffers by (launch's node scratch list identity): each launch list's scratch is
    // its unit's; launches of one unit share them (consecutive launches with equal sizes).
    let mut scratch_at: Vec<Vec<usize>> = Vec::new();
    let mut prev: Option<(String, Vec<usize>)> = None;
    for (l, sizes) in launches {
        let unit = l.entry.split('_').next().unwrap_or("").to_string();
        let same = prev.as_ref().is_some_and(|(u, s)| *u == unit && s == sizes);
        if same {
            let last = scratch_at.last().unwrap().clone();
            scratch_at.push(last);
        } else {
            let at: Vec<usize> = sizes
                .iter()
                .map(|&b| {
                    let at = take(b);
                    init.push((at, vec![0xffu8; b]));
                    at
                })
                .collect();
            scratch_at.push(at);
        }
        prev = Some((unit, sizes.clone()));
    }
    let total = off;
    let mut mem = vec![0u8; total];
    for (at, b) in &init {
        mem[*at..*at + b.len()].copy_from_slice(b);
    }
    let dir = std::env::temp_dir().join("sg_emu").join(tag).to_string_lossy().to_string();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(format!("{dir}/mem.bin"), &mem).unwrap();
    let prelude = concat!(env!("CARGO_MANIFEST_DIR"), "/emu_prelude.h");
    let smem = 1 + launches.iter().map(|(l, _)| l.shared_bytes as usize / 16).max().unwrap_or(0);
    let mut main = format!("#include \"{prelude}\"\n");
    main += "#include <barrier>\n#include <thread>\n#include <vector>\n#include <cstdio>\nthread_local emu_dim3 threadIdx, blockIdx; emu_dim3 blockDim, gridDim;\nstatic thread_local std::barrier<>* emu_bar;\nvoid emu_sync() { emu_bar->arrive_and_wait(); }\n";
    writeln!(main, "float4 emu_smem[{smem}];").unwrap();
    main += "template <class F> void run(unsigned gx, unsigned bx, F f) {\n gridDim = {gx, 1, 1}; blockDim = {bx, 1, 1};\n for (unsigned x = 0; x < gx; ++x) {\n  memset(emu_smem, 0xff, sizeof(emu_smem));\n  std::barrier<> bar(bx); std::vector<std::thread> ts;\n  for (unsigned t = 0; t < bx; ++t) ts.emplace_back([&, t] { threadIdx = {t, 0, 0}; blockIdx = {x, 0, 0}; emu_bar = &bar; f(); });\n  for (auto& th : ts) th.join();\n }\n}\n";
    let mut body = String::new();
    let mut objs = Vec::new();
    for (j, (l, _)) in launches.iter().enumerate() {
        let params_line = l.source.lines().find(|s| s.starts_with("#define KERNEL_PARAMS ")).unwrap().trim_start_matches("#define KERNEL_PARAMS ").to_string();
        let decls: Vec<&str> = params_line.split(", ").collect();
        assert_eq!(decls.len(), l.args.len());
        let proto: Vec<String> = decls.iter().map(|d| if d.contains('*') { "void*".to_string() } else { d.rsplit_once(' ').unwrap().0.to_string() }).collect();
        writeln!(main, "extern \"C\" void {}({});", l.entry, proto.join(", ")).unwrap();
        let args: Vec<String> = l
            .args
            .iter()
            .map(|a| match a {
                Arg::Ptr(t) => format!("(void*)(M + {})", tensor_at[&t.0]),
                Arg::Scratch(i) => format!("(void*)(M + {})", scratch_at[j][*i]),
                Arg::F64(v) => format!("{v:e}"),
                Arg::I64(v) => format!("{v}LL"),
                Arg::F32(v) => format!("{v:e}f"),
                other => panic!("arg {other:?}"),
            })
            .collect();
        let gx = match l.grid {
            Grid::Exact(x, _, _) => x,
            Grid::Cover(_) => 1,
        };
        writeln!(body, "  run({gx}, {}, [&] {{ {}({}); }});", l.block, l.entry, args.join(", ")).unwrap();
        // The dynamic shared array: the host's one array (the only text the emulation changes).
        let src = l.source.replace("extern __shared__ float4 sg_smem[];", "float4* sg_smem = emu_smem;");
        let src = format!("#include \"{prelude}\"\n{src}");
        let path = format!("{dir}/k{j}.cpp");
        std::fs::write(&path, src).unwrap();
        objs.push(path);
    }
    main += &format!("int main() {{\n  static std::vector<char> mem({total});\n  FILE* f = fopen(\"{dir}/mem.bin\", \"rb\"); fread(mem.data(), 1, {total}, f); fclose(f);\n  char* M = mem.data();\n{body}  f = fopen(\"{dir}/mem.bin\", \"wb\"); fwrite(mem.data(), 1, {total}, f); fclose(f);\n}}\n");
    std::fs::write(format!("{dir}/main.cpp"), main).unwrap();
    let mut cmd = std::process::Command::new("g++");
    cmd.args(["-std=c++20", "-O1", "-pthread", "-w", "-o", &format!("{dir}/emu"), &format!("{dir}/main.cpp")]).args(&objs);
    let out = cmd.output().unwrap();
    if !out.status.success() {
        panic!("g++ failed for {tag}:\n{}", String::from_utf8_lossy(&out.stderr).lines().take(40).collect::<Vec<_>>().join("\n"));
    }
    let st = std::process::Command::new(format!("{dir}/emu")).status().unwrap();
    assert!(st.success(), "{tag}: emulator crashed");
    let mem = std::fs::read(format!("{dir}/mem.bin")).unwrap();
    let mut outs = HashMap::new();
    for id in g.output_tensors() {
        let d = g.desc(id);
        let dt = g.resolved_data_type(id).unwrap_or(DataType::F32);
        let at = tensor_at[&id.0];
        outs.insert(id, try_gather(d, dt, &mem[at..at + required_bytes(d, dt)]).unwrap());
    }
    outs
}

/// The benchmark suite's small-group layers (`ferrodnn-cli/src/bench_conv.rs`) at batch 1, forward,
/// data and weight gradients: ResNeXt-50's 56x56 (32 groups of 4), RegNetY-400MF's and 800MF's
/// 28x28 (13 of 8, 9 of 16), a depthwise channel multiplier of 2 at 56x56.
fn bench_cases() -> Vec<ferrodnn::testing::cases::Case> {
    use ferrodnn::graph::ops::conv::ConvAttrs;
    use ferrodnn::TensorDesc;
    let f = DataType::F16;
    let nhwc = |name: &str, dims: &[i64]| TensorDesc::new(name, dims, f).with_layout(&[0, 2, 3, 1]);
    let mut v = Vec::new();
    for (c, k, hw, groups) in [(128, 128, 56, 32), (104, 104, 28, 13), (144, 144, 28, 9), (72, 144, 56, 72)] {
        let a = ConvAttrs::new(2).with_padding(&[1, 1]);
        let wd = [k, c / groups, 3, 3];
        for kind in ["fprop", "dgrad", "wgrad"] {
            let name = format!("bench_{kind}_1x{c}x{hw}x{hw}_k{k}_g{groups}");
            let mut g = Graph::new(name.clone()).io_data_type(f);
            let out = match kind {
                "fprop" => {
                    let x = g.tensor(nhwc("x", &[1, c, hw, hw]));
                    let w = g.tensor(nhwc("w", &wd));
                    g.conv_fprop(x, w, a.clone())
                }
                "dgrad" => {
                    let dy = g.tensor(nhwc("dy", &[1, k, hw, hw]));
                    let w = g.tensor(nhwc("w", &wd));
                    g.conv_dgrad(dy, w, &[1, c, hw, hw], a.clone())
                }
                _ => {
                    let dy = g.tensor(nhwc("dy", &[1, k, hw, hw]));
                    let x = g.tensor(nhwc("x", &[1, c, hw, hw]));
                    g.conv_wgrad(dy, x, &wd, a.clone())
                }
            };
            g.set_output(out);
            v.push(ferrodnn::testing::cases::Case::new(name, g));
        }
    }
    v
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_else(|| "smallgroup".into());
    let mut failed = 0;
    let cases = if filter == "bench" { bench_cases() } else { ferrodnn::testing::cases::all().into_iter().filter(|c| c.name.contains(&filter)).collect() };
    for case in cases {
        let mut graph = case.graph.clone();
        graph.validate().unwrap();
        let g = &graph;
        let Some(main_launches) = launches(g, false) else { continue };
        if !main_launches.iter().all(|(l, _)| l.entry.contains("sg_conv")) {
            println!("skip {} (kernels {:?})", case.name, main_launches.iter().map(|(l, _)| l.entry.clone()).collect::<Vec<_>>());
            continue;
        }
        let inputs = random_inputs(g, 11);
        let reference = execute_dense(&Handle::reference(), g, &inputs, &PlanPolicy::default()).unwrap();
        for unaligned in [false, true] {
            let Some(ls) = launches(g, unaligned) else { continue };
            let tag = format!("{}{}", case.name, if unaligned { "_u" } else { "" });
            let got = emulate(g, &inputs, &ls, &tag);
            let mut line = format!("{tag:<80}");
            let mut bad = false;
            let mut ids: Vec<_> = reference.keys().copied().collect();
            ids.sort();
            for id in ids {
                let (r, o) = (&reference[&id], &got[&id]);
                let err = relative_error(&o.data, &r.data);
                let dt = g.resolved_data_type(id).unwrap_or(DataType::F32);
                let bound = ferrodnn::testing::check::bound(dt);
                let scale = r.data.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
                let worst = o.data.iter().zip(&r.data).map(|(a, b)| if a.is_nan() { f64::INFINITY } else { (a - b).abs() / scale }).fold(0f64, f64::max);
                write!(line, " err={err:.1e} worst={worst:.1e}").unwrap();
                if !(err <= bound) || !(worst <= 20.0 * bound) {
                    bad = true;
                    if let Some(i) = o.data.iter().zip(&r.data).position(|(a, b)| a.is_nan() || (a - b).abs() > 20.0 * bound * scale) {
                        write!(line, " [BAD@{i}: {} vs {}]", o.data[i], r.data[i]).unwrap();
                    }
                }
            }
            if bad {
                failed += 1;
            }
            println!("{} {line}", if bad { "FAIL" } else { "ok  " });
        }
    }
    if failed > 0 {
        println!("{failed} failed");
        std::process::exit(1);
    }
}
