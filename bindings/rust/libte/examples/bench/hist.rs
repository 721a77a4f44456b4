//! bench's latency histogram (te-bench's buckets).

// -------------------------------------------------------------- histogram

/// Log-linear buckets: 64 per power of two, under 1.6 % error.
pub(crate) const SUB_BITS: u32 = 6;
pub(crate) const SUB: u64 = 1 << SUB_BITS;
pub(crate) const NBUCKETS: usize = ((64 - SUB_BITS + 1) as usize) * SUB as usize;

#[derive(Clone)]
pub(crate) struct Hist {
    pub(crate) n: Vec<u64>,
    pub(crate) count: u64,
    pub(crate) max: u64,
}

impl Hist {
    pub(crate) fn new() -> Hist {
        Hist { n: vec![0; NBUCKETS], count: 0, max: 0 }
    }

    pub(crate) fn bucket_of(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let e = 63 - v.leading_zeros();
        ((e - SUB_BITS + 1) as u64 * SUB + ((v >> (e - SUB_BITS)) & (SUB - 1))) as usize
    }

    pub(crate) fn bucket_mid(b: usize) -> f64 {
        if (b as u64) < SUB {
            return b as f64;
        }
        let e = (b as u64 / SUB) as i32 + SUB_BITS as i32 - 1;
        let s = b as u64 % SUB;
        let lo = (SUB + s) as f64 * 2f64.powi(e - SUB_BITS as i32);
        lo + 2f64.powi(e - SUB_BITS as i32) / 2.0
    }

    pub(crate) fn add(&mut self, v: u64, times: u64) {
        self.n[Hist::bucket_of(v)] += times;
        self.count += times;
        self.max = self.max.max(v);
    }

    pub(crate) fn merge(&mut self, h: &Hist) {
        for (a, b) in self.n.iter_mut().zip(&h.n) {
            *a += b;
        }
        self.count += h.count;
        self.max = self.max.max(h.max);
    }

    pub(crate) fn pct(&self, p: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let want = ((p * self.count as f64).ceil() as u64).max(1);
        let mut acc = 0;
        for (i, n) in self.n.iter().enumerate() {
            acc += n;
            if acc >= want {
                return Hist::bucket_mid(i).min(self.max as f64);
            }
        }
        self.max as f64
    }
}
