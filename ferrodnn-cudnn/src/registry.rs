//! Live handles and descriptors by address. A C caller hands back the opaque pointers we gave
//! it; each kind's registry knows which are alive, so a null, destroyed, foreign or wrong-kind
//! pointer is CUDNN_STATUS_BAD_PARAM, never a dereference. Every access holds the registry's
//! lock, so even a descriptor destroyed by another thread mid-call is never used after it is
//! freed.

use crate::api::{bad, ApiError, R};
use crate::types::CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// The live objects of one kind, by the address handed to C.
pub struct Registry<T> {
    what: &'static str,
    live: Mutex<BTreeMap<usize, Box<T>>>,
}

impl<T> Registry<T> {
    pub const fn new(what: &'static str) -> Registry<T> {
        Registry { what, live: Mutex::new(BTreeMap::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Box<T>>> {
        // A panic while the lock was held cannot leave the map inconsistent (inserts and
        // removes are single operations), so a poisoned lock is still usable.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `v` alive and returns the address C will know it by.
    pub fn create(&self, v: T) -> *mut c_void {
        let b = Box::new(v);
        let addr = &*b as *const T as usize;
        self.lock().insert(addr, b);
        addr as *mut c_void
    }

    /// Destroys the object at `p`.
    pub fn destroy(&self, p: *mut c_void) -> R<()> {
        let removed = self.lock().remove(&(p as usize));
        match removed {
            Some(b) => {
                drop(b);
                Ok(())
            }
            None => Err(self.unknown(p)),
        }
    }

    fn unknown(&self, p: *mut c_void) -> ApiError {
        if p.is_null() {
            ApiError::new(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, format!("the {} is a null pointer", self.what))
        } else {
            bad(format!("{p:?} is not a live {} (never created, already destroyed, or another kind of object)", self.what))
        }
    }

    /// Runs `f` on the object at `p` (under the registry's lock).
    pub fn with<U>(&self, p: *mut c_void, f: impl FnOnce(&mut T) -> R<U>) -> R<U> {
        let mut live = self.lock();
        match live.get_mut(&(p as usize)) {
            Some(b) => f(b),
            None => Err(self.unknown(p)),
        }
    }

    /// A copy of the object at `p`.
    pub fn get(&self, p: *mut c_void) -> R<T>
    where
        T: Clone,
    {
        self.with(p, |t| Ok(t.clone()))
    }

    /// Whether `p` is a live object of this kind.
    pub fn contains(&self, p: *mut c_void) -> bool {
        self.lock().contains_key(&(p as usize))
    }
}
