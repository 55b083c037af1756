//! Tensor transforms (reshape, transpose, slice, concatenate, copy/cast) on the CPU engine,
//! checked against expectations written out here with explicit index loops, on non-contiguous
//! inputs; layout conversions checked byte by byte at hand-computed offsets; casts across type
//! families; and the errors of malformed graphs.

use ferrodnn::testing::{random_inputs, run_cpu};
use ferrodnn::{DataType, Error, Graph, Handle, Nd, TensorDesc, TensorId, VariantPack};
use std::collections::HashMap;

/// Run on the CPU engine and return y.
fn run_one(g: &Graph, inputs: &HashMap<TensorId, Nd>, y: TensorId) -> Nd {
    let outs = run_cpu(g, inputs).expect("graph runs");
    outs.get(&y).expect("y is an output").clone()
}

/// The message of the InvalidGraph error `validate` must return.
fn invalid(mut g: Graph) -> String {
    match g.validate() {
        Err(Error::InvalidGraph(msg)) => msg,
        other => panic!("expected InvalidGraph, got {other:?}"),
    }
}

fn assert_invalid(g: Graph, parts: &[&str]) {
    let msg = invalid(g);
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
    }
}

/// A value at a 3-D index of a dense row-major array, computed from the dims by hand.
fn at3(x: &Nd, i: usize, j: usize, k: usize) -> f64 {
    let (d1, d2) = (x.dims[1], x.dims[2]);
    x.data[(i * d1 + j) * d2 + k]
}

fn at4(x: &Nd, n: usize, c: usize, h: usize, w: usize) -> f64 {
    let (dc, dh, dw) = (x.dims[1], x.dims[2], x.dims[3]);
    x.data[((n * dc + c) * dh + h) * dw + w]
}

#[test]
fn reshape_reads_logical_row_major_order_of_strided_inputs() {
    for dt in [DataType::F64, DataType::F32, DataType::F16, DataType::I32] {
        let mut g = Graph::new("reshape");
        // [3, 4, 5] stored with axis 0 innermost, and padded (gaps between rows).
        let x = g.tensor(TensorDesc::new("x", &[3, 4, 5], dt).with_strides(&[1, 7 * 5, 7]));
        let y = g.reshape(x, &[5, -1]);
        g.set_output(y);
        g.validate().unwrap();
        assert_eq!(g.desc(y).dims, vec![5, 12]);
        assert_eq!(g.desc(y).strides, vec![12, 1]);
        let inputs = random_inputs(&g, 11);
        let xs = &inputs[&x];
        let out = run_one(&g, &inputs, y);
        assert_eq!(out.dims, vec![5, 12]);
        // numpy: flat position p of y is flat position p of x in logical row-major order.
        for r in 0..5 {
            for c in 0..12 {
                let p = r * 12 + c;
                let (i, j, k) = (p / 20, (p / 5) % 4, p % 5);
                assert_eq!(out.data[r * 12 + c], at3(xs, i, j, k), "{dt} y[{r},{c}]");
            }
        }
    }
}

#[test]
fn reshape_to_higher_rank_and_into_channels_last_output() {
    let mut g = Graph::new("reshape_up");
    let x = g.tensor(TensorDesc::new("x", &[6, 5], DataType::F32));
    let y = g.reshape(x, &[2, 3, 5]);
    g.set_output(y);
    // The user asks for y stored with axis 1 innermost.
    g.desc_mut(y).strides = vec![15, 1, 3];
    g.validate().unwrap();
    let inputs = random_inputs(&g, 12);
    let out = run_one(&g, &inputs, y);
    let xs = &inputs[&x];
    for a in 0..2 {
        for b in 0..3 {
            for c in 0..5 {
                let p = (a * 3 + b) * 5 + c;
                assert_eq!(at3(&out, a, b, c), xs.data[(p / 5) * 5 + p % 5]);
            }
        }
    }
}

#[test]
fn transpose_permutes_axes_of_padded_inputs() {
    for dt in [DataType::F64, DataType::Bf16, DataType::Fp8E4m3, DataType::I8] {
        let mut g = Graph::new("transpose");
        // [3, 5, 7] with gaps on every axis.
        let x = g.tensor(TensorDesc::new("x", &[3, 5, 7], dt).with_strides(&[6 * 9, 9, 1]));
        let y = g.transpose(x, &[2, 0, 1]);
        g.set_output(y);
        g.validate().unwrap();
        assert_eq!(g.desc(y).dims, vec![7, 3, 5]);
        let inputs = random_inputs(&g, 21);
        let xs = &inputs[&x];
        let out = run_one(&g, &inputs, y);
        for a in 0..7 {
            for b in 0..3 {
                for c in 0..5 {
                    // y axis 0 is x axis 2, y axis 1 is x axis 0, y axis 2 is x axis 1.
                    assert_eq!(at3(&out, a, b, c), at3(xs, b, c, a), "{dt}");
                }
            }
        }
    }
    // A 4-D permutation of a channels-last input.
    let mut g = Graph::new("transpose4");
    let x = g.tensor(TensorDesc::new("x", &[2, 3, 5, 7], DataType::F32).with_layout(&[0, 2, 3, 1]));
    let y = g.transpose(x, &[3, 1, 0, 2]);
    g.set_output(y);
    g.validate().unwrap();
    assert_eq!(g.desc(y).dims, vec![7, 3, 2, 5]);
    let inputs = random_inputs(&g, 22);
    let xs = &inputs[&x];
    let out = run_one(&g, &inputs, y);
    for w in 0..7 {
        for c in 0..3 {
            for n in 0..2 {
                for h in 0..5 {
                    assert_eq!(at4(&out, w, c, n, h), at4(xs, n, c, h, w));
                }
            }
        }
    }
}

#[test]
fn slice_with_and_without_steps() {
    for dt in [DataType::F32, DataType::F16, DataType::U8] {
        let mut g = Graph::new("slice");
        // [7, 9, 5] stored transposed (axis 2 outermost).
        let x = g.tensor(TensorDesc::new("x", &[7, 9, 5], dt).with_layout(&[2, 1, 0]));
        let y = g.slice(x, &[1, 2, 0], &[6, 9, 3]);
        let z = g.slice_with_steps(x, &[1, 0, 4], &[7, 9, 5], &[2, 3, 1]);
        g.set_output(y);
        g.set_output(z);
        g.validate().unwrap();
        assert_eq!(g.desc(y).dims, vec![5, 7, 3]);
        // ceil(6 / 2) = 3, ceil(9 / 3) = 3, 1.
        assert_eq!(g.desc(z).dims, vec![3, 3, 1]);
        // y keeps x's stride order.
        assert_eq!(g.desc(y).strides, vec![1, 5, 35]);
        let inputs = random_inputs(&g, 31);
        let xs = &inputs[&x];
        let outs = run_cpu(&g, &inputs).unwrap();
        for i in 0..5 {
            for j in 0..7 {
                for k in 0..3 {
                    assert_eq!(at3(&outs[&y], i, j, k), at3(xs, i + 1, j + 2, k), "{dt}");
                }
            }
        }
        for i in 0..3 {
            for j in 0..3 {
                assert_eq!(at3(&outs[&z], i, j, 0), at3(xs, 1 + 2 * i, 3 * j, 4), "{dt}");
            }
        }
    }
}

#[test]
fn concatenate_on_each_axis_with_mixed_layouts() {
    for axis in 0..3 {
        let mut dims = [[2, 3, 5], [2, 3, 5], [2, 3, 5]];
        dims[0][axis] = 1;
        dims[1][axis] = 4;
        dims[2][axis] = 2;
        let mut g = Graph::new("concat");
        let x0 = g.tensor(TensorDesc::new("x0", &dims[0], DataType::F32));
        // Padded strides.
        let s1 = [dims[1][1] * 8, 8, 1];
        let x1 = g.tensor(TensorDesc::new("x1", &dims[1], DataType::F32).with_strides(&s1));
        // Reversed axis order.
        let x2 = g.tensor(TensorDesc::new("x2", &dims[2], DataType::F32).with_layout(&[2, 1, 0]));
        let y = g.concatenate(&[x0, x1, x2], axis);
        g.set_output(y);
        g.validate().unwrap();
        let mut want_dims = vec![2i64, 3, 5];
        want_dims[axis] = 7;
        assert_eq!(g.desc(y).dims, want_dims);
        let inputs = random_inputs(&g, 41 + axis as u64);
        let out = run_one(&g, &inputs, y);
        for i in 0..want_dims[0] as usize {
            for j in 0..want_dims[1] as usize {
                for k in 0..want_dims[2] as usize {
                    let mut idx = [i, j, k];
                    let pos = idx[axis];
                    // Positions 0 | 1..5 | 5..7 on the axis.
                    let (src, local) = if pos < 1 {
                        (x0, pos)
                    } else if pos < 5 {
                        (x1, pos - 1)
                    } else {
                        (x2, pos - 5)
                    };
                    idx[axis] = local;
                    assert_eq!(at3(&out, i, j, k), at3(&inputs[&src], idx[0], idx[1], idx[2]), "axis {axis} at {i},{j},{k}");
                }
            }
        }
    }
    // A single input is a copy.
    let mut g = Graph::new("concat1");
    let x = g.tensor(TensorDesc::new("x", &[3, 7], DataType::F16));
    let y = g.concatenate(&[x], 1);
    g.set_output(y);
    let inputs = random_inputs(&g, 45);
    assert_eq!(run_one(&g, &inputs, y), inputs[&x]);
}

/// Values that name their own index: v = n*1000 + c*100 + h*10 + w.
fn tagged(n: usize, c: usize, h: usize, w: usize) -> f64 {
    (n * 1000 + c * 100 + h * 10 + w) as f64
}

#[test]
fn copy_nchw_to_nhwc_bytes_at_hand_computed_offsets() {
    // [n, c, h, w] = [2, 3, 4, 5]; NHWC strides are [h*w*c, 1, w*c, c] = [60, 1, 15, 3].
    let (dn, dc, dh, dw) = (2, 3, 4, 5);
    for out_type in [DataType::F32, DataType::F64] {
        let mut g = Graph::new("to_nhwc");
        let x = g.tensor(TensorDesc::new("x", &[2, 3, 4, 5], DataType::F32).with_uid(1));
        let y = g.copy(x, Some(&[60, 1, 15, 3]), Some(out_type));
        g.set_output(y);
        g.desc_mut(y).uid = Some(2);
        g.validate().unwrap();
        // x packed NCHW: offset n*60 + c*20 + h*5 + w.
        let mut xs = vec![0u8; 120 * 4];
        for n in 0..dn {
            for c in 0..dc {
                for h in 0..dh {
                    for w in 0..dw {
                        let off = n * 60 + c * 20 + h * 5 + w;
                        xs[off * 4..off * 4 + 4].copy_from_slice(&(tagged(n, c, h, w) as f32).to_le_bytes());
                    }
                }
            }
        }
        let size = out_type.size();
        let mut ys = vec![0xffu8; 120 * size];
        let plan = Handle::cpu().build_plans(&g, &Default::default()).unwrap().remove(0);
        let mut pack = VariantPack::new();
        pack.input(1, &xs).output(2, &mut ys);
        plan.execute(&mut pack, None).unwrap();
        for n in 0..dn {
            for c in 0..dc {
                for h in 0..dh {
                    for w in 0..dw {
                        let off = n * 60 + h * 15 + w * 3 + c;
                        let b = &ys[off * size..off * size + size];
                        let v = if size == 4 { f32::from_le_bytes(b.try_into().unwrap()) as f64 } else { f64::from_le_bytes(b.try_into().unwrap()) };
                        assert_eq!(v, tagged(n, c, h, w), "{out_type} n{n} c{c} h{h} w{w}");
                    }
                }
            }
        }
    }
}

#[test]
fn copy_nhwc_to_nchw_with_cast_to_f16_bytes() {
    let (dn, dc, dh, dw) = (2, 3, 4, 5);
    let mut g = Graph::new("to_nchw");
    let x = g.tensor(TensorDesc::new("x", &[2, 3, 4, 5], DataType::F32).with_strides(&[60, 1, 15, 3]).with_uid(7));
    // No strides: y would follow x's (channels-last) order, so ask for NCHW explicitly.
    let y = g.copy(x, Some(&[60, 20, 5, 1]), Some(DataType::F16));
    g.set_output(y);
    g.desc_mut(y).uid = Some(8);
    g.validate().unwrap();
    let mut xs = vec![0u8; 120 * 4];
    for n in 0..dn {
        for c in 0..dc {
            for h in 0..dh {
                for w in 0..dw {
                    let off = n * 60 + h * 15 + w * 3 + c;
                    // Tag / 8 keeps every value exact in f16 (at most 1234/8, multiples of 1/8).
                    xs[off * 4..off * 4 + 4].copy_from_slice(&((tagged(n, c, h, w) / 8.0) as f32).to_le_bytes());
                }
            }
        }
    }
    let mut ys = vec![0xffu8; 120 * 2];
    let plan = Handle::cpu().build_plans(&g, &Default::default()).unwrap().remove(0);
    let mut pack = VariantPack::new();
    pack.input(7, &xs).output(8, &mut ys);
    plan.execute(&mut pack, None).unwrap();
    for n in 0..dn {
        for c in 0..dc {
            for h in 0..dh {
                for w in 0..dw {
                    let off = n * 60 + c * 20 + h * 5 + w;
                    let bits = u16::from_le_bytes([ys[2 * off], ys[2 * off + 1]]);
                    assert_eq!(f16_bits_to_f64(bits), tagged(n, c, h, w) / 8.0, "n{n} c{c} h{h} w{w}");
                }
            }
        }
    }
}

#[test]
fn copy_default_layout_follows_input_and_padded_output_leaves_gaps() {
    let mut g = Graph::new("gaps");
    let x = g.tensor(TensorDesc::new("x", &[3, 5], DataType::F32).with_uid(1));
    let y = g.copy(x, Some(&[8, 1]), None);
    g.set_output(y);
    g.desc_mut(y).uid = Some(2);
    let z = g.copy(x, None, None);
    assert_eq!(g.desc(z).strides, vec![5, 1]);
    g.validate().unwrap();
    let vals: Vec<f64> = (0..15).map(|i| i as f64 * 0.5 - 3.0).collect();
    let xs = DataType::F32.encode(&vals);
    let mut ys = vec![0xabu8; (2 * 8 + 5) * 4];
    let plan = Handle::cpu().build_plans(&g, &Default::default()).unwrap().remove(0);
    let mut pack = VariantPack::new();
    pack.input(1, &xs).output(2, &mut ys);
    plan.execute(&mut pack, None).unwrap();
    for r in 0..3 {
        for c in 0..8 {
            let off = (r * 8 + c) * 4;
            if c < 5 {
                assert_eq!(f32::from_le_bytes(ys[off..off + 4].try_into().unwrap()) as f64, vals[r * 5 + c]);
            } else if r < 2 {
                assert_eq!(&ys[off..off + 4], &[0xab; 4], "gap at row {r} col {c} was written");
            }
        }
    }
}

/// IEEE half bits to value, written out (sign, 5-bit exponent, 10-bit mantissa).
fn f16_bits_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = ((bits >> 10) & 0x1f) as i32;
    let m = (bits & 0x3ff) as f64;
    match e {
        0 => sign * m * 2f64.powi(-24),
        31 => {
            if m == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            }
        }
        _ => sign * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
    }
}

/// Run `copy` of the given f32 values to `to`, returning the raw output bytes.
fn cast_bytes(values: &[f64], from: DataType, to: DataType) -> Vec<u8> {
    let mut g = Graph::new("cast");
    let x = g.tensor(TensorDesc::new("x", &[values.len() as i64], from).with_uid(1));
    let y = g.copy(x, None, Some(to));
    g.set_output(y);
    g.desc_mut(y).uid = Some(2);
    g.validate().unwrap();
    let xs = from.encode(values);
    let mut ys = vec![0x5au8; values.len() * to.size()];
    let plan = Handle::cpu().build_plans(&g, &Default::default()).unwrap().remove(0);
    let mut pack = VariantPack::new();
    pack.input(1, &xs).output(2, &mut ys);
    plan.execute(&mut pack, None).unwrap();
    ys
}

#[test]
fn cast_f32_to_f16_rounds_to_nearest_even() {
    let third = 1.0f32 / 3.0;
    let vals = [1.0, third as f64, 0.1f32 as f64, 2049.0, 2051.0, 65504.0, 1e5, -2.0, 1e-8, 2f64.powi(-24)];
    let ys = cast_bytes(&vals, DataType::F32, DataType::F16);
    let bits: Vec<u16> = ys.chunks(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
    // Hand-encoded halves: 1.0 = 0x3c00; 1/3 -> 0x3555 (0.333251953125); 0.1 -> 0x2e66
    // (0.0999755859375); 2049 is a tie between 2048 and 2050 -> even 2048 = 0x6800; 2051 is a
    // tie between 2050 and 2052 -> even 2052 = 0x6802; 65504 = 0x7bff (largest); 1e5 overflows
    // to +inf = 0x7c00 (IEEE rounding; only fp8 and integers saturate); -2 = 0xc000; 1e-8 is
    // below half the smallest subnormal -> +0; 2^-24 is the smallest subnormal 0x0001.
    assert_eq!(bits, vec![0x3c00, 0x3555, 0x2e66, 0x6800, 0x6802, 0x7bff, 0x7c00, 0xc000, 0x0000, 0x0001]);
    assert_eq!(f16_bits_to_f64(0x3555), 0.333251953125);
}

#[test]
fn cast_f32_to_fp8_saturates_and_rounds_to_even() {
    let vals = [1.0, 448.0, 1000.0, -1000.0, f64::INFINITY, 0.3, 17.0, 19.0, 2f64.powi(-9), 2f64.powi(-11), -0.0, f64::NAN];
    let ys = cast_bytes(&vals, DataType::F32, DataType::Fp8E4m3);
    // e4m3fn: bias 7, 3 mantissa bits, max 448 = 0x7e, NaN = 0x7f.
    // 1.0 = 0 0111 000 = 0x38; 448 = 0 1111 110 = 0x7e; 1000 and inf saturate to 448, -1000 to
    // -448 = 0xfe; 0.3 = 1.2 * 2^-2 -> 1.25 * 2^-2 = 0 0101 010 = 0x2a; 17 = 1.0625 * 16 is a
    // tie between 16 (m=0) and 18 (m=1) -> 16 = 0 1011 000 = 0x58; 19 = 1.1875 * 16 is a tie
    // between 18 (m=1) and 20 (m=2) -> 20 = 0x5a; 2^-9 is the smallest subnormal 0x01; 2^-11
    // is a quarter of it -> 0; -0 -> 0x80.
    assert_eq!(&ys[..11], &[0x38, 0x7e, 0x7e, 0xfe, 0x7e, 0x2a, 0x58, 0x5a, 0x01, 0x00, 0x80]);
    assert_eq!(ys[11] & 0x7f, 0x7f, "NaN stays NaN");
    // e5m2: max 57344 = 0 11110 11 = 0x7b; 1e6 saturates; 1.0 = 0 01111 00 = 0x3c.
    let ys = cast_bytes(&[1.0, 1e6, -1e6, 57344.0], DataType::F32, DataType::Fp8E5m2);
    assert_eq!(ys, vec![0x3c, 0x7b, 0xfb, 0x7b]);
}

#[test]
fn cast_f32_to_integers_rounds_half_away_and_saturates() {
    let vals = [2.5, -2.5, 1.4, -1.6, 300.0, -300.0, 127.0, -128.0, f64::NAN, 0.49];
    let ys = cast_bytes(&vals, DataType::F32, DataType::I8);
    let got: Vec<i8> = ys.iter().map(|&b| b as i8).collect();
    assert_eq!(got, vec![3, -3, 1, -2, 127, -128, 127, -128, 0, 0]);
    let ys = cast_bytes(&[-5.0, 255.4, 300.0, 7.5], DataType::F32, DataType::U8);
    assert_eq!(ys, vec![0, 255, 255, 8]);
    let ys = cast_bytes(&[3e9, -3e9, 123456.5, -7.0], DataType::F64, DataType::I32);
    let got: Vec<i32> = ys.chunks(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(got, vec![i32::MAX, i32::MIN, 123457, -7]);
}

#[test]
fn cast_to_and_from_bool_and_between_families() {
    let ys = cast_bytes(&[0.0, -0.5, 2.0, -0.0, 1e-30], DataType::F32, DataType::Bool);
    assert_eq!(ys, vec![0, 1, 1, 0, 1]);
    // bool -> f32: 0 and 1.
    let ys = cast_bytes(&[1.0, 0.0, 1.0], DataType::Bool, DataType::F32);
    let got: Vec<f32> = ys.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(got, vec![1.0, 0.0, 1.0]);
    // i32 -> f16: 2049 is not representable (tie to even 2048), -7 is.
    let ys = cast_bytes(&[2049.0, -7.0], DataType::I32, DataType::F16);
    let got: Vec<f64> = ys.chunks(2).map(|b| f16_bits_to_f64(u16::from_le_bytes([b[0], b[1]]))).collect();
    assert_eq!(got, vec![2048.0, -7.0]);
    // fp8 -> i8 (values exact in e4m3: 448, -3.5 rounds away to -4, 0.75 to 1).
    let ys = cast_bytes(&[448.0, -3.5, 0.75], DataType::Fp8E4m3, DataType::I8);
    assert_eq!(ys.iter().map(|&b| b as i8).collect::<Vec<_>>(), vec![127, -4, 1]);
    // f16 -> bf16: 1 + 2^-10 is exact in f16; bf16 keeps 7 mantissa bits -> 1.0 = 0x3f80.
    let ys = cast_bytes(&[1.0 + 2f64.powi(-10), 3.0], DataType::F16, DataType::Bf16);
    assert_eq!(ys, vec![0x80, 0x3f, 0x40, 0x40]);
}

#[test]
fn transforms_chain_through_virtual_tensors_in_f64_exactly() {
    // slice -> transpose -> reshape -> concatenate with itself, all virtual but the last.
    // Virtual tensors take the intermediate type (f32 unless set): ask for f64 throughout.
    let mut g = Graph::new("chain").intermediate_data_type(DataType::F64);
    let x = g.tensor(TensorDesc::new("x", &[5, 7], DataType::F64).with_strides(&[1, 5]));
    let s = g.slice(x, &[1, 0], &[4, 7]); // [3, 7]
    let t = g.transpose(s, &[1, 0]); // [7, 3]
    let r = g.reshape(t, &[3, 7]);
    let y = g.concatenate(&[r, r], 0); // [6, 7]
    g.set_output(y);
    g.validate().unwrap();
    let inputs = random_inputs(&g, 51);
    let xs = &inputs[&x];
    let out = run_one(&g, &inputs, y);
    assert_eq!(out.dims, vec![6, 7]);
    for i in 0..6 {
        for j in 0..7 {
            // r flat p = (i % 3) * 7 + j is t[p / 3, p % 3] = s[p % 3, p / 3] = x[p % 3 + 1, p / 3].
            let p = (i % 3) * 7 + j;
            assert_eq!(out.data[i * 7 + j], xs.data[(p % 3 + 1) * 7 + p / 3]);
        }
    }
    // With the default (f32) intermediate type the same chain rounds each value to f32 once.
    g.intermediate_data_type = None;
    let out = run_one(&g, &inputs, y);
    for i in 0..6 {
        for j in 0..7 {
            let p = (i % 3) * 7 + j;
            assert_eq!(out.data[i * 7 + j], xs.data[(p % 3 + 1) * 7 + p / 3] as f32 as f64);
        }
    }
}

#[test]
fn slice_attrs_round_trip_through_json() {
    let mut g = Graph::new("json");
    let x = g.tensor(TensorDesc::new("x", &[7, 9], DataType::F32));
    let y = g.slice_with_steps(x, &[1, 2], &[7, 9], &[3, 2]);
    g.set_output(y);
    g.validate().unwrap();
    let back = Graph::from_json(&g.to_json().unwrap()).unwrap();
    assert_eq!(back, g);
    assert_eq!(back.desc(y).dims, vec![2, 4]);
}

// ---- Bad graphs ----

#[test]
fn reshape_count_mismatch_names_both_shapes() {
    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", &[3, 5], DataType::F32));
    let y = g.reshape(x, &[4, 4]);
    g.set_output(y);
    assert_invalid(g, &["reshape", "15 elements", "[3, 5]", "[4, 4]", "16"]);

    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", &[3, 5], DataType::F32));
    let y = g.reshape(x, &[4, -1]);
    g.set_output(y);
    assert_invalid(g, &["target dim 1 must be positive, got -1", "could not be resolved"]);
}

#[test]
fn transpose_rejects_non_permutations() {
    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", &[3, 5, 7], DataType::F32));
    let y = g.transpose(x, &[0, 2, 2]);
    g.set_output(y);
    assert_invalid(g, &["transpose", "not a permutation of 0..3", "axis 2 appears twice"]);

    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", &[3, 5, 7], DataType::F32));
    let y = g.transpose(x, &[1, 0]);
    g.set_output(y);
    assert_invalid(g, &["has 2 entries but input `x` has rank 3"]);

    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", &[3, 5], DataType::F32));
    let y = g.transpose(x, &[0, 3]);
    g.set_output(y);
    assert_invalid(g, &["names axis 3"]);
}

#[test]
fn slice_errors_name_the_axis() {
    let bad = |starts: &[i64], ends: &[i64], steps: &[i64], want: &[&str]| {
        let mut g = Graph::new("bad");
        let x = g.tensor(TensorDesc::new("x", &[4, 6], DataType::F32));
        let y = g.slice_with_steps(x, starts, ends, steps);
        g.set_output(y);
        assert_invalid(g, want);
    };
    bad(&[0, 0], &[4, 7], &[], &["slice", "axis 1: end must be in 1..=6", "got 7"]);
    bad(&[2, 0], &[2, 6], &[], &["axis 0: end must be in 3..=4", "got 2"]);
    bad(&[-1, 0], &[4, 6], &[], &["axis 0: start must be in 0..4", "got -1"]);
    bad(&[0, 0], &[4, 6], &[1, 0], &["axis 1: step must be at least 1, got 0"]);
    bad(&[0], &[4], &[], &["one start and one end per axis", "got 1 starts and 1 ends"]);
    bad(&[0, 0], &[4, 6], &[1], &["one step per axis", "got 1 steps"]);
}

#[test]
fn concatenate_errors() {
    let mut g = Graph::new("bad");
    let a = g.tensor(TensorDesc::new("a", &[2, 3], DataType::F32));
    let b = g.tensor(TensorDesc::new("b", &[2, 3, 1], DataType::F32));
    let y = g.concatenate(&[a, b], 0);
    g.set_output(y);
    assert_invalid(g, &["concatenate", "`x1` has rank 3", "`x0` has rank 2"]);

    let mut g = Graph::new("bad");
    let a = g.tensor(TensorDesc::new("a", &[2, 3], DataType::F32));
    let b = g.tensor(TensorDesc::new("b", &[4, 5], DataType::F32));
    let y = g.concatenate(&[a, b], 0);
    g.set_output(y);
    assert_invalid(g, &["`x1` has dims [4, 5] but `x0` has [2, 3]", "differ on axis 1"]);

    let mut g = Graph::new("bad");
    let a = g.tensor(TensorDesc::new("a", &[2, 3], DataType::F32));
    let y = g.concatenate(&[a, a], 2);
    g.set_output(y);
    assert_invalid(g, &["axis must be below the rank 2", "got 2"]);

    let mut g = Graph::new("bad");
    let y = g.concatenate(&[], 0);
    g.set_output(y);
    assert_invalid(g, &["at least one input"]);

    let mut g = Graph::new("bad");
    let a = g.tensor(TensorDesc::new("a", &[1], DataType::F32));
    let y = g.concatenate(&vec![a; 65], 0);
    g.set_output(y);
    assert_invalid(g, &["at most 64 inputs, got 65"]);
}

#[test]
fn copy_rejects_bad_output_strides() {
    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", &[2, 3, 4], DataType::F32));
    let y = g.copy(x, Some(&[12, 4]), None);
    g.set_output(y);
    assert_invalid(g, &["copy", "has 2 strides for 3 dims"]);

    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", &[2, 3, 4], DataType::F32));
    let y = g.copy(x, Some(&[12, 0, 1]), None);
    g.set_output(y);
    assert_invalid(g, &["zero stride", "outputs cannot broadcast"]);

    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", &[2, 3, 4], DataType::F32));
    let y = g.copy(x, Some(&[12, 2, 1]), Some(DataType::F16));
    g.set_output(y);
    assert_invalid(g, &["overlap"]);
}
