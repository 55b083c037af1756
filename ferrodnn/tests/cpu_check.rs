//! The fast CPU engine against the f64 reference on every check case whose nodes it takes (at
//! least one node on its own kernels), with the per-type bounds of the GPU check; and every
//! other check case once, on the reference's code through the fast engine's plan.

use ferrodnn::engine::cpu_fast::fast_node_count;
use ferrodnn::engine::PlanPolicy;
use ferrodnn::testing::cases;
use ferrodnn::testing::check::check_against_reference;
use ferrodnn::{EngineKind, Handle};

#[test]
fn fast_cpu_engine_matches_the_reference_on_the_check_cases() {
    let handle = Handle::cpu();
    let policy = PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() };
    let mut fast = 0;
    let mut failures = Vec::new();
    for case in cases::all() {
        let mut g = case.graph.clone();
        g.validate().unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let n = fast_node_count(&g).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        if n == 0 {
            continue;
        }
        fast += 1;
        for seed in [1, 2] {
            match check_against_reference(&handle, &g, &policy, seed) {
                Ok(outs) => {
                    let worst = outs.iter().map(|o| o.rel_error / o.bound).fold(0.0, f64::max);
                    eprintln!("PASS {:<48} {n} fast nodes, worst error/bound {worst:.2e}", case.name);
                }
                Err(e) => failures.push(format!("{} (seed {seed}): {e}", case.name)),
            }
        }
    }
    assert!(fast >= 40, "only {fast} check cases have nodes the fast engine takes");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

mod errors {
    use ferrodnn::engine::{Buffer, PlanPolicy, VariantPack};
    use ferrodnn::graph::ops::conv::ConvAttrs;
    use ferrodnn::{DataType, EngineKind, Graph, Handle, TensorDesc};

    /// conv (NHWC, f32) -> bias -> relu, uids 1..=4, and its fast CPU plan.
    fn conv_plan() -> (Graph, ferrodnn::engine::Plan) {
        let mut g = Graph::new("conv_bias_relu").io_data_type(DataType::F32);
        let x = g.tensor(TensorDesc::new("x", &[2, 8, 9, 9], DataType::F32).with_layout(&[0, 2, 3, 1]).with_uid(1));
        let w = g.tensor(TensorDesc::new("w", &[16, 8, 3, 3], DataType::F32).with_layout(&[0, 2, 3, 1]).with_uid(2));
        let b = g.tensor(TensorDesc::new("b", &[1, 16, 1, 1], DataType::F32).with_uid(3));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
        let y = g.bias(y, b);
        let y = g.relu(y);
        g.set_output(y);
        g.desc_mut(y).uid = Some(4);
        g.validate().unwrap();
        let plan = Handle::cpu().build_plans(&g, &PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() }).unwrap().remove(0);
        (g, plan)
    }

    fn bufs() -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>) {
        (vec![0u8; 2 * 8 * 81 * 4], vec![0u8; 16 * 8 * 9 * 4], vec![0u8; 16 * 4], vec![0u8; 2 * 16 * 81 * 4])
    }

    #[test]
    fn the_plan_says_which_nodes_run_where_and_needs_a_workspace() {
        let (_, plan) = conv_plan();
        let text = plan.explain().expect("the fast CPU plan explains itself");
        assert!(
            text.contains("conv_fprop") && (text.contains("im2col") || text.contains("direct")) && text.contains("epilogue") && text.contains("bias") && text.contains("relu"),
            "{text}"
        );
        assert!(plan.workspace_size() > 0);
    }

    #[test]
    fn a_small_workspace_is_refused_naming_the_sizes() {
        let (_, plan) = conv_plan();
        let (x, w, b, mut y) = bufs();
        let mut ws = vec![0u8; plan.workspace_size() - 1];
        let mut pack = VariantPack::new();
        pack.input(1, &x).input(2, &w).input(3, &b).output(4, &mut y);
        let e = plan.execute(&mut pack, Some(Buffer::HostMut(&mut ws))).unwrap_err().to_string();
        assert!(e.contains("conv_bias_relu") && e.contains(&plan.workspace_size().to_string()), "{e}");
        // None at all.
        let e = plan.execute(&mut pack, None).unwrap_err().to_string();
        assert!(e.contains("workspace") && e.contains("0 were given"), "{e}");
    }

    #[test]
    fn a_read_only_workspace_is_refused() {
        let (_, plan) = conv_plan();
        let (x, w, b, mut y) = bufs();
        let ws = vec![0u8; plan.workspace_size()];
        let mut pack = VariantPack::new();
        pack.input(1, &x).input(2, &w).input(3, &b).output(4, &mut y);
        let e = plan.execute(&mut pack, Some(Buffer::Host(&ws))).unwrap_err().to_string();
        assert!(e.contains("writable host workspace"), "{e}");
    }

    #[test]
    fn a_read_only_output_a_missing_input_and_a_short_buffer_are_refused() {
        let (_, plan) = conv_plan();
        let (x, w, b, y) = bufs();
        let mut ws = vec![0u8; plan.workspace_size()];
        let mut pack = VariantPack::new();
        pack.input(1, &x).input(2, &w).input(3, &b).input(4, &y);
        let e = plan.execute(&mut pack, Some(Buffer::HostMut(&mut ws))).unwrap_err().to_string();
        assert!(e.contains("\"relu_") && e.contains("writable"), "{e}");
        let mut y2 = y.clone();
        let mut pack = VariantPack::new();
        pack.input(1, &x).input(3, &b).output(4, &mut y2);
        let e = plan.execute(&mut pack, Some(Buffer::HostMut(&mut ws))).unwrap_err().to_string();
        assert!(e.contains("tensor \"w\"") && e.contains("no buffer"), "{e}");
        let mut pack = VariantPack::new();
        pack.input(1, &x[..x.len() - 4]).input(2, &w).input(3, &b).output(4, &mut y2);
        let e = plan.execute(&mut pack, Some(Buffer::HostMut(&mut ws))).unwrap_err().to_string();
        assert!(e.contains("tensor \"x\"") && e.contains(&(x.len()).to_string()), "{e}");
    }

    #[test]
    fn nodes_the_fast_kernels_do_not_take_run_on_the_reference_code() {
        // An f64 matmul (a type the fast kernels do not take) and a transpose (an op they do
        // not take): both on the reference's code, said so by the plan.
        let mut g = Graph::new("f64_and_transpose").io_data_type(DataType::F64);
        let a = g.tensor(TensorDesc::new("a", &[3, 5], DataType::F64));
        let b = g.tensor(TensorDesc::new("b", &[5, 4], DataType::F64));
        let c = g.matmul(a, b);
        let y = g.transpose(c, &[1, 0]);
        g.set_output(y);
        g.validate().unwrap();
        let plan = Handle::cpu().build_plans(&g, &PlanPolicy::default()).unwrap().remove(0);
        assert_eq!(plan.engine(), EngineKind::Cpu);
        let text = plan.explain().unwrap();
        assert!(text.contains("matmul") && text.contains("reference (f64)") && text.contains("compute type f64") && text.contains("does not take this op"), "{text}");
        let inputs = ferrodnn::testing::random_inputs(&g, 3);
        let got = ferrodnn::testing::execute_dense(&Handle::cpu(), &g, &inputs, &PlanPolicy::default()).unwrap();
        let want = ferrodnn::testing::run_cpu(&g, &inputs).unwrap();
        assert_eq!(got[&y].data, want[&y].data);
    }

    #[test]
    fn unaligned_f32_buffers_give_the_aligned_results() {
        // a [33, 20] x b [20, 17] -> c, no epilogue: the plan writes c in place when aligned.
        let mut g = Graph::new("unaligned").io_data_type(DataType::F32);
        let a = g.tensor(TensorDesc::new("a", &[33, 20], DataType::F32).with_uid(1));
        let b = g.tensor(TensorDesc::new("b", &[20, 17], DataType::F32).with_uid(2));
        let c = g.matmul(a, b);
        g.set_output(c);
        g.desc_mut(c).uid = Some(3);
        g.validate().unwrap();
        let plan = Handle::cpu().build_plans(&g, &PlanPolicy::default()).unwrap().remove(0);
        assert_eq!(plan.engine(), EngineKind::Cpu);
        let av: Vec<f64> = (0..33 * 20).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
        let bv: Vec<f64> = (0..20 * 17).map(|i| ((i * 5) % 11) as f64 - 5.0).collect();
        let (ab, bb) = (DataType::F32.encode(&av), DataType::F32.encode(&bv));
        let run = |shift: usize| -> Vec<f64> {
            let (mut ax, mut bx, mut cx) = (vec![0u8; ab.len() + 4], vec![0u8; bb.len() + 4], vec![0u8; 33 * 17 * 4 + 4]);
            ax[shift..shift + ab.len()].copy_from_slice(&ab);
            bx[shift..shift + bb.len()].copy_from_slice(&bb);
            let mut ws = vec![0u8; plan.workspace_size()];
            let mut pack = VariantPack::new();
            pack.input(1, &ax[shift..]).input(2, &bx[shift..]).output(3, &mut cx[shift..]);
            plan.execute(&mut pack, (!ws.is_empty()).then(|| Buffer::HostMut(&mut ws))).unwrap();
            DataType::F32.decode(&cx[shift..shift + 33 * 17 * 4])
        };
        let aligned = run(0);
        // Integer-valued inputs: every sum is exact in f32, so the results are the products.
        for i in 0..33 {
            for j in 0..17 {
                let want: f64 = (0..20).map(|k| av[i * 20 + k] * bv[k * 17 + j]).sum();
                assert_eq!(aligned[i * 17 + j], want);
            }
        }
        for shift in [1, 2, 3] {
            assert_eq!(run(shift), aligned, "buffers shifted by {shift} bytes");
        }
    }

    #[test]
    fn unaligned_f32_convolution_buffers_give_the_aligned_results() {
        // The direct kernel reads channels-last and NCHW one-tap images and writes their
        // outputs in place when they are 4-byte aligned; shifted buffers take the packed path.
        for (taps, layout) in [(3i64, Some(&[0usize, 2, 3, 1][..])), (1, None)] {
            let mut g = Graph::new("unaligned_conv").io_data_type(DataType::F32);
            let (mut xd, mut wd) = (TensorDesc::new("x", &[2, 5, 12, 11], DataType::F32).with_uid(1), TensorDesc::new("w", &[16, 5, taps, taps], DataType::F32).with_uid(2));
            if let Some(l) = layout {
                (xd, wd) = (xd.with_layout(l), wd.with_layout(l));
            }
            let (x, w) = (g.tensor(xd), g.tensor(wd));
            let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[taps / 2, taps / 2]));
            g.set_output(y);
            g.desc_mut(y).uid = Some(3);
            g.validate().unwrap();
            let plan = Handle::cpu().build_plans(&g, &PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() }).unwrap().remove(0);
            let xv: Vec<f64> = (0..2 * 5 * 132).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
            let wv: Vec<f64> = (0..16 * 5 * taps * taps).map(|i| ((i * 5) % 11) as f64 - 5.0).collect();
            let (xb, wb) = (DataType::F32.encode(&xv), DataType::F32.encode(&wv));
            let run = |shift: usize| -> Vec<f64> {
                let (mut xs, mut ws_, mut ys) = (vec![0u8; xb.len() + 4], vec![0u8; wb.len() + 4], vec![0u8; 2 * 16 * 132 * 4 + 4]);
                xs[shift..shift + xb.len()].copy_from_slice(&xb);
                ws_[shift..shift + wb.len()].copy_from_slice(&wb);
                let mut ws = vec![0u8; plan.workspace_size()];
                let mut pack = VariantPack::new();
                pack.input(1, &xs[shift..]).input(2, &ws_[shift..]).output(3, &mut ys[shift..]);
                plan.execute(&mut pack, Some(Buffer::HostMut(&mut ws))).unwrap();
                DataType::F32.decode(&ys[shift..shift + 2 * 16 * 132 * 4])
            };
            let aligned = run(0);
            assert!(aligned.iter().any(|&v| v != 0.0));
            for shift in [1, 2, 3] {
                // Integer-valued inputs: every sum is exact in f32, whatever the order.
                assert_eq!(run(shift), aligned, "taps {taps}, shifted by {shift} bytes");
            }
        }
    }

    #[test]
    fn one_tap_f32_convolutions_read_and_write_in_place_in_every_layout() {
        // The fast engine's in-place paths: the image as its own im2col matrix and the output
        // written by the GEMM (blocks across images for packed channels-last, within one image
        // for NCHW images of 2048 pixels or more, im2col for smaller NCHW ones); odd sizes, a
        // padded channel stride.
        let cases: [(&[i64], Option<&[usize]>); 4] = [(&[2, 8, 48, 48], None), (&[2, 8, 48, 48], Some(&[0, 2, 3, 1])), (&[3, 5, 7, 9], None), (&[3, 5, 7, 9], Some(&[0, 2, 3, 1]))];
        for (dims, layout) in cases {
            let mut g = Graph::new("one_tap").io_data_type(DataType::F32);
            let mut xd = TensorDesc::new("x", dims, DataType::F32);
            let mut wd = TensorDesc::new("w", &[11, dims[1], 1, 1], DataType::F32);
            if let Some(l) = layout {
                xd = xd.with_layout(l);
                wd = wd.with_layout(l);
            }
            let x = g.tensor(xd);
            let w = g.tensor(wd);
            let y = g.conv_fprop(x, w, ConvAttrs::new(2));
            g.set_output(y);
            g.validate().unwrap();
            let policy = PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() };
            let outs = ferrodnn::testing::check::check_against_reference(&Handle::cpu(), &g, &policy, 7).unwrap_or_else(|e| panic!("{dims:?} {layout:?}: {e}"));
            assert!(outs.iter().all(|o| o.rel_error < 1e-6), "{dims:?} {layout:?}: {outs:?}");
        }
    }

    #[test]
    fn a_handle_of_one_thread_runs_its_plans_on_one_thread_with_the_same_results() {
        let (g, plan) = conv_plan();
        let one = Handle::cpu_with_threads(1).unwrap();
        let plan1 = one.build_plans(&g, &PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() }).unwrap().remove(0);
        let text = plan1.explain().unwrap();
        assert!(text.contains("(1 threads)"), "{text}");
        let inputs = ferrodnn::testing::random_inputs(&g, 5);
        let a = ferrodnn::testing::execute_plan_dense(&one, &plan1, &inputs).unwrap();
        let b = ferrodnn::testing::execute_plan_dense(&Handle::cpu(), &plan, &inputs).unwrap();
        for (id, v) in &a {
            let err = ferrodnn::testing::relative_error(&v.data, &b[id].data);
            assert!(err < 1e-6, "{err}");
        }
        let e = Handle::cpu_with_threads(0).err().expect("0 threads is refused").to_string();
        assert!(e.contains("at least 1 thread") && e.contains("got 0"), "{e}");
    }
}
