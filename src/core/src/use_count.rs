//! Uses of an object by others: an EP of its PZ, EVDs and SRQ, an EVD of its CNO, ...

use parking_lot::Mutex;

/// Counts uses of an object by others (an EP of a PZ, an EVD of a CNO, ...) and refuses new uses
/// once the object is being freed, so "free while in use" and "use while freeing" cannot race.
#[derive(Default)]
pub struct UseCount {
    state: Mutex<(usize, bool)>,
}

impl UseCount {
    /// Records one more user; false once the object is retired.
    pub fn acquire(&self) -> bool {
        let mut s = self.state.lock();
        if s.1 {
            return false;
        }
        s.0 += 1;
        true
    }
    pub fn release(&self) {
        let mut s = self.state.lock();
        s.0 = s.0.saturating_sub(1);
    }
    /// Retires the object if nobody uses it; else returns the number of users.
    pub fn retire(&self) -> Result<(), usize> {
        let mut s = self.state.lock();
        if s.0 > 0 {
            return Err(s.0);
        }
        s.1 = true;
        Ok(())
    }
    /// Undoes a successful `retire` (a later check refused the free).
    pub fn release_retire(&self) {
        self.state.lock().1 = false;
    }
    /// Retires regardless of users (abrupt teardown).
    pub fn force_retire(&self) {
        self.state.lock().1 = true;
    }
    pub fn users(&self) -> usize {
        self.state.lock().0
    }
}
