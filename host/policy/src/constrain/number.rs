//! Numbers under `minimum`/`maximum` bounds: which digit strings may still grow into a number in
//! range, and which may end there.

/// Most integer digits when a number has no bounds.
pub(super) const DEFAULT_INT_DIGITS: usize = 6;

/// Most fraction digits of a number.
const FRACTION_DIGITS: usize = 3;

/// What a number may be: an integer or not, its bounds (`(value, exclusive)`), and how many
/// integer digits it may have.
#[derive(Debug, Clone, Copy)]
pub(super) struct NumSpec {
    pub(super) integer: bool,
    pub(super) lo: Option<(f64, bool)>,
    pub(super) hi: Option<(f64, bool)>,
    pub(super) int_digits: usize,
}

impl NumSpec {
    /// Whether some value in `[a, b]` is within the bounds.
    fn in_range(&self, a: f64, b: f64) -> bool {
        let lo_ok = match self.lo {
            None => true,
            Some((lo, true)) => b > lo,
            Some((lo, false)) => b >= lo,
        };
        let hi_ok = match self.hi {
            None => true,
            Some((hi, true)) => a < hi,
            Some((hi, false)) => a <= hi,
        };
        lo_ok && hi_ok
    }

    /// `text`'s sign, integer digits and fraction digits (after a `.`).
    fn parts(text: &str) -> (bool, &str, Option<&str>) {
        let (neg, rest) = match text.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, text),
        };
        match rest.split_once('.') {
            Some((i, f)) => (neg, i, Some(f)),
            None => (neg, rest, None),
        }
    }

    /// Whether `text` is a well-formed prefix some completion of which is in range.
    pub(super) fn viable(&self, text: &str) -> bool {
        let (neg, int, frac) = Self::parts(text);
        if int.len() > self.int_digits || !int.chars().all(|c| c.is_ascii_digit()) {
            return false;
        }
        if int.len() > 1 && int.starts_with('0') {
            return false;
        }
        if let Some(f) = frac
            && (self.integer || int.is_empty() || f.len() > FRACTION_DIGITS || !f.chars().all(|c| c.is_ascii_digit()))
        {
            return false;
        }
        let sign = if neg { -1.0 } else { 1.0 };
        let span = |a: f64, b: f64| if neg { self.in_range(-b, -a) } else { self.in_range(a, b) };
        if int.is_empty() {
            let max = 10f64.powi(self.int_digits as i32);
            return span(0.0, max);
        }
        let base: f64 = int.parse().unwrap_or(0.0);
        if let Some(f) = frac {
            let scale = 10f64.powi(f.len() as i32);
            let v = base + f.parse::<f64>().unwrap_or(0.0) / scale;
            let width = if f.len() < FRACTION_DIGITS { 1.0 / scale } else { 0.0 };
            let _ = sign;
            return span(v, v + width);
        }
        let frac_width = if self.integer { 0.0 } else { 1.0 - 10f64.powi(-(FRACTION_DIGITS as i32)) };
        if int == "0" {
            return span(0.0, frac_width);
        }
        (0..=self.int_digits - int.len()).any(|k| {
            let scale = 10f64.powi(k as i32);
            let a = base * scale;
            span(a, a + scale - 1.0 + frac_width)
        })
    }

    /// Whether `text` is a complete number in range.
    pub(super) fn can_end(&self, text: &str) -> bool {
        let (neg, int, frac) = Self::parts(text);
        if int.is_empty() || frac.is_some_and(str::is_empty) || !self.viable(text) {
            return false;
        }
        let v: f64 = text.parse().unwrap_or(f64::NAN);
        let _ = neg;
        v.is_finite() && self.in_range(v, v)
    }
}
