//! Runs the CUDA engine's RNN kernels on the host and compares them with the reference engine,
//! without a GPU: each launch's text (its defines and templates, as the plan generates it) is
//! compiled by g++ after `emu_prelude.h` (the prelude's loads, stores and index helpers, with
//! CUDA's qualifiers emptied), each CUDA thread runs as a std::thread, `__syncthreads` is a
//! barrier of the block's threads, blocks run one after another (so `__shared__` arrays can be
//! function statics). Buffers and scratch are poisoned before the run, so an element no kernel
//! writes shows as NaN. Both plans run: the RNN engine's (float accumulators) and the fallback's
//! (double). Only SIMT code emulates this way (no mma, wgmma, TMA or grid-wide sync).
//!
//! `cargo run --release -- [name filter]` (needs g++ with C++20); files go under
//! `$TMPDIR/rnn_emu/`.

use ferrodnn::engine::cuda::kernel::{Arg, Grid};
use ferrodnn::engine::cuda::{planner, Options, Target};
use ferrodnn::engine::{Handle, PlanPolicy};
use ferrodnn::graph::ops::rnn::{RnnBackwardInputs, RnnBiasMode, RnnDesc, RnnInputs, RnnLayout, RnnMode};
use ferrodnn::layout::{required_bytes, scatter, try_gather};
use ferrodnn::testing::{execute_dense, random_inputs, relative_error};
use ferrodnn::{DataType, Graph, Nd, TensorDesc, TensorId};
use std::collections::HashMap;
use std::fmt::Write;

fn emulate(g: &Graph, inputs: &HashMap<TensorId, Nd>, fused: bool, tag: &str) -> HashMap<TensorId, Nd> {
    let units = planner::units(g, &Target::sm90a(), &Options::default(), fused).unwrap();
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
    let mut launches = Vec::new();
    for u in &units {
        let scratch: Vec<usize> = u
            .kernels
            .scratch
            .iter()
            .map(|&b| {
                let at = take(b);
                init.push((at, vec![0xffu8; b]));
                at
            })
            .collect();
        for l in &u.kernels.launches {
            launches.push((l.clone(), scratch.clone()));
        }
    }
    let total = off;
    let mut mem = vec![0u8; total];
    for (at, b) in &init {
        mem[*at..*at + b.len()].copy_from_slice(b);
    }
    let dir = std::env::temp_dir().join("rnn_emu").join(tag).to_string_lossy().to_string();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(format!("{dir}/mem.bin"), &mem).unwrap();
    let prelude = concat!(env!("CARGO_MANIFEST_DIR"), "/emu_prelude.h");
    let mut main = format!("#include \"{prelude}\"\n");
    main += "#include <barrier>\n#include <thread>\n#include <vector>\n#include <cstdio>\nthread_local emu_dim3 threadIdx, blockIdx; emu_dim3 blockDim, gridDim;\nstatic thread_local std::barrier<>* emu_bar;\nvoid emu_sync() { emu_bar->arrive_and_wait(); }\n";
    main += "template <class F> void run(unsigned gx, unsigned gy, unsigned bx, F f) {\n gridDim = {gx, gy, 1}; blockDim = {bx, 1, 1};\n for (unsigned y = 0; y < gy; ++y) for (unsigned x = 0; x < gx; ++x) {\n  std::barrier<> bar(bx); std::vector<std::thread> ts;\n  for (unsigned t = 0; t < bx; ++t) ts.emplace_back([&, t] { threadIdx = {t, 0, 0}; blockIdx = {x, y, 0}; emu_bar = &bar; f(); });\n  for (auto& th : ts) th.join();\n }\n}\n";
    let mut body = String::new();
    let mut objs = Vec::new();
    for (j, (l, scratch)) in launches.iter().enumerate() {
        let params_line = l.source.lines().find(|s| s.starts_with("#define KERNEL_PARAMS ")).unwrap().trim_start_matches("#define KERNEL_PARAMS ").to_string();
        let decls: Vec<&str> = params_line.split(", ").collect();
        assert_eq!(decls.len(), l.args.len());
        let proto: Vec<String> = decls
            .iter()
            .map(|d| {
                if d.contains('*') {
                    "void*".to_string()
                } else if d.starts_with("TRef") {
                    "TRef".into()
                } else {
                    d.rsplit_once(' ').unwrap().0.to_string()
                }
            })
            .collect();
        writeln!(main, "extern \"C\" void {}({});", l.entry, proto.join(", ")).unwrap();
        let args: Vec<String> = l
            .args
            .iter()
            .map(|a| match a {
                Arg::Ptr(t) => format!("(void*)(M + {})", tensor_at[&t.0]),
                Arg::Ref(t) => {
                    let r = ferrodnn::engine::cuda::kernel::TRef::of(g, *t);
                    format!("TRef{{{{{}}}, {{{}}}, {}, 0}}", r.dims.map(|x| format!("{x}LL")).join(","), r.strides.map(|x| format!("{x}LL")).join(","), r.rank)
                }
                Arg::Scratch(i) => format!("(void*)(M + {})", scratch[*i]),
                Arg::F64(v) => format!("{v:e}"),
                Arg::I64(v) => format!("{v}LL"),
                Arg::F32(v) => format!("{v:e}f"),
                other => panic!("arg {other:?}"),
            })
            .collect();
        let (gx, gy) = match l.grid {
            Grid::Exact(x, y, _) => (x, y),
            Grid::Cover(_) => (1, 1),
        };
        writeln!(body, "  run({gx}, {gy}, {}, [&] {{ {}({}); }});", l.block, l.entry, args.join(", ")).unwrap();
        let src = format!("#include \"{prelude}\"\n{}", l.source);
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

struct Spec {
    name: &'static str,
    desc: RnnDesc,
    dt: DataType,
    lens: Option<Vec<usize>>,
    train: bool,
    dw_in: bool,
}

fn build(s: &Spec) -> Graph {
    let a = &s.desc;
    let dt = s.dt;
    let mut g = Graph::new(s.name).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &a.seq_dims(a.input_size), dt));
    let w = g.tensor(TensorDesc::new("w", &[a.weight_space_elements()], dt));
    let lstm = a.cell_mode == RnnMode::Lstm;
    let hx = g.tensor(TensorDesc::new("hx", &[a.pseudo_layers(), a.batch, a.proj()], dt));
    let cx = lstm.then(|| g.tensor(TensorDesc::new("cx", &[a.pseudo_layers(), a.batch, a.hidden_size], dt)));
    let len = s.lens.as_ref().map(|_| g.tensor(TensorDesc::new("len", &[a.batch], DataType::I32)));
    let (seed, offset) = if a.has_dropout() {
        (Some(g.tensor(TensorDesc::scalar("seed", 12345.0, DataType::I64))), Some(g.tensor(TensorDesc::scalar("offset", 3.0, DataType::I64))))
    } else {
        (None, None)
    };
    let o = g.rnn(x, w, RnnInputs { hx: Some(hx), cx, seq_lengths: len, seed, offset }, a.clone());
    for t in [Some(o.y), Some(o.hy), o.cy, o.reserve].into_iter().flatten() {
        g.set_output(t);
    }
    if s.train {
        let reserve = o.reserve.unwrap();
        let dy = g.tensor(TensorDesc::new("dy", &a.seq_dims(a.out_size()), dt));
        let dhy = g.tensor(TensorDesc::new("dhy", &[a.pseudo_layers(), a.batch, a.proj()], dt));
        let dcy = lstm.then(|| g.tensor(TensorDesc::new("dcy", &[a.pseudo_layers(), a.batch, a.hidden_size], dt)));
        let gr = g.rnn_backward_data(dy, w, reserve, RnnBackwardInputs { hx: Some(hx), cx, dhy: Some(dhy), dcy, seq_lengths: len }, a.clone());
        for t in [Some(gr.dx), Some(gr.dhx), gr.dcx, Some(gr.dgates)].into_iter().flatten() {
            g.set_output(t);
        }
        let dwin = s.dw_in.then(|| g.tensor(TensorDesc::new("dw_in", &[a.weight_space_elements()], dt)));
        let dw = g.rnn_backward_weights(x, reserve, gr.dgates, Some(hx), len, dwin, a.clone());
        g.set_output(dw);
    }
    g.validate().unwrap();
    g
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let base = |m| RnnDesc::new(m, 7, 13, 9, 5);
    let r5 = Some(vec![9, 5, 0, 7, 9]);
    let dec = Some(vec![9, 7, 5, 3, 0]);
    let specs = vec![
        Spec { name: "relu_uni_1l", desc: base(RnnMode::Relu).training(), dt: DataType::F32, lens: r5.clone(), train: true, dw_in: false },
        Spec { name: "tanh_bi_2l", desc: base(RnnMode::Tanh).layers(2).bidirectional().training(), dt: DataType::F32, lens: r5.clone(), train: true, dw_in: false },
        Spec { name: "lstm_bi_2l", desc: base(RnnMode::Lstm).layers(2).bidirectional().training(), dt: DataType::F32, lens: r5.clone(), train: true, dw_in: true },
        Spec { name: "gru_bi_2l", desc: base(RnnMode::Gru).layers(2).bidirectional().training(), dt: DataType::F32, lens: r5.clone(), train: true, dw_in: false },
        Spec {
            name: "lstmp_clip_bi_2l",
            desc: base(RnnMode::Lstm).layers(2).bidirectional().with_proj(6).with_clip(-0.4, 0.3, false).training(),
            dt: DataType::F32,
            lens: r5.clone(),
            train: true,
            dw_in: false,
        },
        Spec {
            name: "gru_packed_recbias",
            desc: base(RnnMode::Gru).layers(2).bidirectional().with_layout(RnnLayout::SeqMajorPacked).with_bias(RnnBiasMode::SingleRec).training(),
            dt: DataType::F32,
            lens: dec.clone(),
            train: true,
            dw_in: false,
        },
        Spec {
            name: "lstm_batchmajor_inpbias",
            desc: base(RnnMode::Lstm).bidirectional().with_layout(RnnLayout::BatchMajorUnpacked).with_bias(RnnBiasMode::SingleInp).training(),
            dt: DataType::F32,
            lens: r5.clone(),
            train: true,
            dw_in: false,
        },
        Spec {
            name: "lstm_dropout_3l",
            desc: RnnDesc { dropout: Some(0.3), padding_fill: -2.0, ..base(RnnMode::Lstm).layers(3).bidirectional().training() },
            dt: DataType::F32,
            lens: r5.clone(),
            train: true,
            dw_in: false,
        },
        Spec { name: "tanh_nobias_infer", desc: base(RnnMode::Tanh).layers(2).with_bias(RnnBiasMode::NoBias), dt: DataType::F32, lens: None, train: false, dw_in: false },
        Spec { name: "lstm_f64", desc: base(RnnMode::Lstm).layers(2).bidirectional().with_proj(5).training(), dt: DataType::F64, lens: r5.clone(), train: true, dw_in: false },
        Spec {
            name: "big_lstmp_bi_2l",
            desc: RnnDesc::new(RnnMode::Lstm, 70, 40, 20, 7).layers(2).bidirectional().with_proj(33).training(),
            dt: DataType::F32,
            lens: Some(vec![20, 19, 3, 0, 20, 11, 17]),
            train: true,
            dw_in: true,
        },
        Spec {
            name: "big_gru_packed",
            desc: RnnDesc::new(RnnMode::Gru, 70, 40, 20, 7).layers(2).with_layout(RnnLayout::SeqMajorPacked).training(),
            dt: DataType::F32,
            lens: Some(vec![20, 19, 17, 11, 3, 3, 0]),
            train: true,
            dw_in: false,
        },
        Spec { name: "gru_f16", desc: base(RnnMode::Gru).bidirectional().training(), dt: DataType::F16, lens: r5.clone(), train: true, dw_in: false },
    ];
    for s in specs.iter().filter(|s| s.name.contains(&filter)) {
        let g = build(s);
        let mut inputs = random_inputs(&g, 7);
        let scale = 1.0 / (s.desc.hidden_size as f64).sqrt();
        let w = g.find("w").unwrap();
        for v in &mut inputs.get_mut(&w).unwrap().data {
            *v = s.dt.quantize(*v * scale);
        }
        if let (Some(l), Some(lens)) = (g.find("len"), &s.lens) {
            inputs.insert(l, Nd::new(vec![lens.len()], lens.iter().map(|&x| x as f64).collect()));
        }
        let reference = execute_dense(&Handle::reference(), &g, &inputs, &PlanPolicy::default()).unwrap();
        for fused in [true, false] {
            let got = emulate(&g, &inputs, fused, &format!("{}_{}", s.name, fused));
            let mut line = format!("{:<26} {:<8}", s.name, if fused { "rnn" } else { "fallback" });
            let mut bad = false;
            let mut ids: Vec<_> = reference.keys().copied().collect();
            ids.sort();
            for id in ids {
                let r = &reference[&id];
                let o = &got[&id];
                let err = relative_error(&o.data, &r.data);
                let dt = g.resolved_data_type(id).unwrap_or(DataType::F32);
                let bound = if fused { ferrodnn::testing::check::bound(dt) } else { ferrodnn::testing::check::bound(dt).min(1e-5) };
                let name = g.desc(id).name.rsplit("::").next().unwrap().to_string();
                write!(line, " {name}={err:.1e}").unwrap();
                if !(err <= bound) {
                    bad = true;
                    let first = o.data.iter().zip(&r.data).position(|(a, b)| (a - b).abs() > 1e-3 * b.abs().max(1.0) || a.is_nan() != b.is_nan());
                    if let Some(i) = first {
                        write!(line, "[BAD@{i}: {} vs {}]", o.data[i], r.data[i]).unwrap();
                    }
                }
            }
            println!("{} {line}", if bad { "FAIL" } else { "ok  " });
        }
    }
}
