//! Shape overrides: one graph, built once at a "cache shape", run on tensors whose dims and
//! strides differ from call to call (the cudnn frontend's `override_uids`, `override_shapes` and
//! `override_strides` at execution).
//!
//! An override gives a tensor (by uid) new dims and strides of the same rank. [`Graph::with_overrides`]
//! applies a set of them to a copy of the graph: the tensors the ops write that no override names
//! are inferred again from the new shapes (keeping their layout, the order of their strides), and
//! the result is validated like any graph, so a shape the ops cannot take is refused with the op's
//! own message (which tensor, what was expected, what was given). Sizes may grow or shrink; only
//! the rank is fixed. Engines build (or take from their cache) a plan for the graph this gives.
//!
//! ```
//! use ferrodnn::graph::overrides::ShapeOverrides;
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! let f = DataType::F32;
//! let mut g = Graph::new("mm").io_data_type(f);
//! let a = g.tensor(TensorDesc::new("a", &[1, 4, 8], f).with_uid(1));
//! let b = g.tensor(TensorDesc::new("b", &[1, 8, 16], f).with_uid(2));
//! let c = g.matmul(a, b);
//! g.set_output(c);
//! g.desc_mut(c).uid = Some(3);
//! g.validate().unwrap();
//!
//! let mut o = ShapeOverrides::new();
//! o.set(1, &[2, 6, 8], &[48, 8, 1]).set(2, &[2, 8, 32], &[256, 32, 1]);
//! let g2 = g.with_overrides(&o).unwrap();
//! assert_eq!(g2.desc(c).dims, vec![2, 6, 32]); // inferred again
//! assert_ne!(g2.key(), g.key());
//!
//! // The rank is fixed.
//! let err = g.with_overrides(ShapeOverrides::new().set(1, &[6, 8], &[])).unwrap_err();
//! assert!(err.to_string().contains("rank"), "{err}");
//! ```

use super::{stride_order, strides_for_order, Graph};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};

/// New dims and strides for tensors of a graph, by uid (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ShapeOverrides {
    entries: BTreeMap<i64, (Vec<i64>, Vec<i64>)>,
}

impl ShapeOverrides {
    pub fn new() -> ShapeOverrides {
        ShapeOverrides::default()
    }

    /// Give tensor `uid` the dims `dims` and strides `strides`. Empty strides mean packed in the
    /// order of the tensor's own strides (its layout kept). A second call for one uid replaces the
    /// first.
    pub fn set(&mut self, uid: i64, dims: &[i64], strides: &[i64]) -> &mut ShapeOverrides {
        self.entries.insert(uid, (dims.to_vec(), strides.to_vec()));
        self
    }

    /// The frontend's three lists: `shapes[i]` and `strides[i]` are those of tensor `uids[i]`.
    /// Errors when the lists differ in length or a uid comes twice.
    pub fn from_lists(uids: &[i64], shapes: &[Vec<i64>], strides: &[Vec<i64>]) -> Result<ShapeOverrides> {
        if uids.len() != shapes.len() || uids.len() != strides.len() {
            return Err(Error::InvalidArgument(format!(
                "shape overrides: override_uids, override_shapes and override_strides must have one entry per tensor, got {}, {} and {}",
                uids.len(),
                shapes.len(),
                strides.len()
            )));
        }
        let mut o = ShapeOverrides::new();
        for ((&uid, dims), st) in uids.iter().zip(shapes).zip(strides) {
            if o.entries.contains_key(&uid) {
                return Err(Error::InvalidArgument(format!("shape overrides: uid {uid} is given twice in override_uids; give each tensor once")));
            }
            o.set(uid, dims, st);
        }
        Ok(o)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The overrides as (uid, dims, strides), by uid.
    pub fn iter(&self) -> impl Iterator<Item = (i64, &[i64], &[i64])> {
        self.entries.iter().map(|(&u, (d, s))| (u, d.as_slice(), s.as_slice()))
    }
}

/// An error found while applying overrides, marked as such (its kind kept).
fn in_overrides(gname: &str, e: Error) -> Error {
    let f = |m: String| format!("{gname} with shape overrides: {m}");
    match e {
        Error::InvalidGraph(m) => Error::InvalidGraph(f(m)),
        Error::InvalidArgument(m) => Error::InvalidArgument(f(m)),
        Error::NotSupported(m) => Error::NotSupported(f(m)),
        Error::Serialization(m) => Error::Serialization(f(m)),
        Error::Device(m) => Error::Device(f(m)),
    }
}

impl Graph {
    /// This graph (validated) with the tensors of `overrides` given new dims and strides, the
    /// tensors the ops write inferred again, and the whole validated (see the
    /// [module docs](crate::graph::overrides)). Errors name the tensor (an unknown uid, a
    /// different rank) or, for shapes the ops cannot take, the op and the tensor with what was
    /// expected and what was given.
    pub fn with_overrides(&self, overrides: &ShapeOverrides) -> Result<Graph> {
        let mut g = self.clone();
        g.validate()?;
        if overrides.is_empty() {
            return Ok(g);
        }
        let gname = if g.name.is_empty() { "graph".to_string() } else { format!("graph \"{}\"", g.name) };
        let by_uid: HashMap<i64, usize> = g.tensors.iter().enumerate().filter_map(|(i, t)| t.uid.map(|u| (u, i))).collect();
        let produced = g.produced();
        let mut overridden = vec![false; g.tensors.len()];
        for (uid, dims, strides) in overrides.iter() {
            let Some(&i) = by_uid.get(&uid) else {
                let mut known: Vec<String> = g.io_tensors().iter().map(|&t| format!("{} \"{}\"", g.tensors[t.0].uid.unwrap_or(-1), g.tensors[t.0].name)).collect();
                known.truncate(16);
                return Err(Error::InvalidArgument(format!("{gname} with shape overrides: no tensor has uid {uid} (its tensors with buffers, by uid: {})", known.join(", "))));
            };
            let t = &mut g.tensors[i];
            if dims.len() != t.dims.len() {
                return Err(Error::InvalidArgument(format!(
                    "{gname} with shape overrides: tensor \"{}\" (uid {uid}) has rank {} (dims {:?}) but its override has {} dims {dims:?}; an override changes sizes and strides, not the rank",
                    t.name,
                    t.dims.len(),
                    t.dims,
                    dims.len()
                )));
            }
            // A ragged tensor [b, h, s, d] (packed THD: its offsets give where each batch
            // starts) may be given the strides of its packed buffer [tokens, h, d], one fewer
            // than its dims, as the frontend's THD test passes them (`q.stride()` of the packed
            // tensor): the batch and sequence dims both take the token stride, as the graph's
            // own strides for such a tensor have it.
            let thd;
            let strides = if t.ragged_offset.is_some() && dims.len() == 4 && strides.len() == 3 {
                thd = [strides[0], strides[1], strides[0], strides[2]];
                &thd[..]
            } else {
                strides
            };
            if !strides.is_empty() && strides.len() != dims.len() {
                return Err(Error::InvalidArgument(format!(
                    "{gname} with shape overrides: tensor \"{}\" (uid {uid}): {} strides {strides:?} were given for the {} dims {dims:?}",
                    t.name,
                    strides.len(),
                    dims.len()
                )));
            }
            t.strides = if strides.is_empty() { strides_for_order(dims, &stride_order(&t.strides)) } else { strides.to_vec() };
            t.dims = dims.to_vec();
            overridden[i] = true;
        }
        // What the ops write and no override names is inferred again, node by node in graph
        // order, keeping its layout: its old strides where its dims did not change, else packed
        // strides in the old strides' order (so downstream ops see the layout they were built
        // for). Outputs whose dims the op cannot infer (reshape's, rng's, conv_dgrad's) keep theirs.
        let mut old: HashMap<usize, (Vec<i64>, Vec<i64>)> = HashMap::new();
        for &t in produced.keys() {
            if !overridden[t] {
                let d = &mut g.tensors[t];
                old.insert(t, (std::mem::take(&mut d.dims), std::mem::take(&mut d.strides)));
            }
        }
        let order = g.topological_order()?;
        for ni in order {
            let outs: Vec<usize> = g.nodes[ni].outputs.iter().map(|p| p.tensor.0).filter(|t| old.contains_key(t)).collect();
            if g.infer_node(ni).is_err() {
                for &t in &outs {
                    let (d, _) = &old[&t];
                    g.tensors[t].dims = d.clone();
                    g.tensors[t].strides.clear();
                }
                g.infer_node(ni).map_err(|e| in_overrides(&gname, e))?;
            }
            for t in outs {
                let (od, os) = &old[&t];
                let d = &mut g.tensors[t];
                if d.dims == *od {
                    d.strides = os.clone();
                } else if !d.dims.is_empty() {
                    d.strides = strides_for_order(&d.dims, &stride_order(os));
                }
            }
        }
        g.validate().map_err(|e| in_overrides(&gname, e))?;
        Ok(g)
    }
}
