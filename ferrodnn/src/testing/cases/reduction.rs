use super::Case;

pub(super) fn cases() -> Vec<Case> {
    Vec::new()
}
