//! KV arena page allocator: hands out runs of pages, takes them back.

/// Free-page bookkeeping for the KV arena.
#[derive(Debug)]
pub struct Pages {
    free: Vec<bool>,
}

impl Pages {
    /// An arena of `n` free pages.
    pub fn new(n: u32) -> Self {
        Self {
            free: vec![true; n as usize],
        }
    }

    /// Number of free pages.
    pub fn free_count(&self) -> u32 {
        self.free.iter().filter(|f| **f).count() as u32
    }

    /// Takes `n` pages as (first, count) runs, or none if fewer are free.
    pub fn take(&mut self, n: u32) -> Option<Vec<(u32, u32)>> {
        if self.free_count() < n {
            return None;
        }
        let mut runs: Vec<(u32, u32)> = Vec::new();
        let mut left = n;
        for (i, f) in self.free.iter_mut().enumerate() {
            if left == 0 {
                break;
            }
            if *f {
                *f = false;
                left -= 1;
                let i = i as u32;
                match runs.last_mut() {
                    Some((a, c)) if *a + *c == i => *c += 1,
                    _ => runs.push((i, 1)),
                }
            }
        }
        Some(runs)
    }

    /// Returns runs to the free pool.
    pub fn give_back(&mut self, runs: &[(u32, u32)]) {
        for &(a, c) in runs {
            for i in a..a + c {
                if let Some(f) = self.free.get_mut(i as usize) {
                    *f = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Pages;

    #[test]
    fn takes_runs_and_gives_back() {
        let mut p = Pages::new(10);
        let a = p.take(4).unwrap();
        assert_eq!(a, vec![(0, 4)]);
        let b = p.take(3).unwrap();
        p.give_back(&a);
        assert_eq!(p.take(6).unwrap(), vec![(0, 4), (7, 2)]);
        assert!(p.take(2).is_none());
        p.give_back(&b);
        assert_eq!(p.free_count(), 4);
    }
}
