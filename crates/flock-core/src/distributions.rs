//! How long waits, holds and hand-offs took, as distributions (p50 to max)
//! rather than means: one HdrHistogram per way a wait or a hold ended, made
//! at its first sample, so that endings never seen cost nothing.

use hdrhistogram::Histogram;

use crate::effects::{End, Leave};

/// 2 significant digits, as Redis's own `INFO latencystats`: each value
/// within 1%.
const DIGITS: u8 = 2;
/// Longer samples count as this (a day, in microseconds).
const HIGHEST_US: u64 = 86_400_000_000;

/// The percentiles `INFO` shows, in the order it shows them.
pub const PERCENTILES: [(f64, &str); 4] = [(50.0, "p50"), (90.0, "p90"), (99.0, "p99"), (99.9, "p99.9")];

#[derive(Default, Clone)]
pub struct Distribution(Option<Box<Histogram<u64>>>);

impl Distribution {
    pub fn record(&mut self, us: u64) {
        let h = self.0.get_or_insert_with(|| {
            Box::new(Histogram::new_with_bounds(1, HIGHEST_US, DIGITS).expect("the bounds are valid"))
        });
        h.saturating_record(us.min(HIGHEST_US));
    }

    pub fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|h| h.is_empty())
    }

    pub fn count(&self) -> u64 {
        self.0.as_ref().map_or(0, |h| h.len())
    }

    pub fn mean(&self) -> u64 {
        self.0.as_ref().map_or(0, |h| h.mean() as u64)
    }

    pub fn max(&self) -> u64 {
        self.0.as_ref().map_or(0, |h| h.max())
    }

    /// Adds `other`'s samples.
    pub fn add(&mut self, other: &Distribution) {
        let Some(theirs) = other.0.as_deref() else { return };
        match &mut self.0 {
            Some(mine) => mine.add(theirs).expect("histograms of the same bounds add up"),
            None => self.0 = Some(Box::new(theirs.clone())),
        }
    }

    /// `p50=...,p90=...,p99=...,p99.9=...,max=...` in microseconds with three
    /// decimals, as `INFO latencystats` writes them; all 0 while empty.
    pub fn summary(&self) -> String {
        let value = |p: Option<f64>| match (&self.0, p) {
            (Some(h), _) if h.is_empty() => 0,
            (Some(h), Some(p)) => h.value_at_percentile(p),
            (_, None) => self.max(),
            (None, _) => 0,
        };
        let mut out: Vec<String> =
            PERCENTILES.iter().map(|&(p, name)| format!("{name}={}.000", value(Some(p)))).collect();
        out.push(format!("max={}.000", value(None)));
        out.join(",")
    }
}

/// How a wait ended: granted, or why it left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    Granted,
    Left(Leave),
}

impl WaitEnd {
    pub const ALL: [WaitEnd; 9] = [
        WaitEnd::Granted,
        WaitEnd::Left(Leave::TimedOut),
        WaitEnd::Left(Leave::Unblocked),
        WaitEnd::Left(Leave::Cancelled),
        WaitEnd::Left(Leave::Disconnected),
        WaitEnd::Left(Leave::Deleted),
        WaitEnd::Left(Leave::Demoted),
        WaitEnd::Left(Leave::Resent),
        WaitEnd::Left(Leave::HoldLost),
    ];

    pub fn name(self) -> &'static str {
        match self {
            WaitEnd::Granted => "granted",
            WaitEnd::Left(why) => why.name(),
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|&e| e == self).expect("ALL has every ending")
    }
}

/// Every distribution `INFO flock` shows.
#[derive(Default)]
pub struct Distributions {
    waits: [Distribution; WaitEnd::ALL.len()],
    holds: [Distribution; End::ALL.len()],
    pub handoffs: Distribution,
}

impl Distributions {
    pub fn wait_ended(&mut self, how: WaitEnd, us: u64) {
        self.waits[how.index()].record(us);
    }

    pub fn hold_ended(&mut self, how: End, us: u64) {
        self.holds[how.index()].record(us);
    }

    /// Each wait ending with its distribution, in `WaitEnd::ALL`'s order.
    pub fn waits(&self) -> impl Iterator<Item = (&'static str, &Distribution)> {
        WaitEnd::ALL.iter().map(|e| e.name()).zip(&self.waits)
    }

    /// Each hold ending with its distribution, in `End::ALL`'s order.
    pub fn holds(&self) -> impl Iterator<Item = (&'static str, &Distribution)> {
        End::ALL.iter().map(|e| e.name()).zip(&self.holds)
    }

    /// All waits, or all holds, however they ended.
    pub fn all<'a>(of: impl Iterator<Item = (&'static str, &'a Distribution)>) -> Distribution {
        let mut all = Distribution::default();
        of.for_each(|(_, d)| all.add(d));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_distribution_shows_zeros_and_costs_nothing() {
        let d = Distribution::default();
        assert_eq!(d.summary(), "p50=0.000,p90=0.000,p99=0.000,p99.9=0.000,max=0.000");
        assert!(d.is_empty());
    }

    #[test]
    fn percentiles_are_within_one_percent_of_the_samples() {
        let mut d = Distribution::default();
        (1..=1000u64).for_each(|v| d.record(v * 1000));
        let fields: Vec<(String, f64)> = d
            .summary()
            .split(',')
            .map(|f| {
                let (k, v) = f.split_once('=').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect();
        let want =
            [("p50", 500_000.0), ("p90", 900_000.0), ("p99", 990_000.0), ("p99.9", 999_000.0), ("max", 1_000_000.0)];
        for ((name, got), (want_name, want)) in fields.iter().zip(want) {
            assert_eq!(name, want_name);
            assert!((got - want).abs() <= want * 0.01, "{name}: {got} is not within 1% of {want}");
        }
    }

    #[test]
    fn samples_beyond_a_day_count_as_a_day() {
        let mut d = Distribution::default();
        d.record(u64::MAX);
        d.record(0);
        assert_eq!(d.count(), 2);
        assert!(d.summary().ends_with(&format!(
            "max={}.000",
            Histogram::<u64>::new_with_bounds(1, HIGHEST_US, DIGITS).unwrap().highest_equivalent(HIGHEST_US)
        )));
    }

    #[test]
    fn each_ending_has_its_own_distribution_and_all_adds_them_up() {
        let mut ds = Distributions::default();
        ds.wait_ended(WaitEnd::Granted, 10);
        ds.wait_ended(WaitEnd::Left(Leave::TimedOut), 20);
        ds.wait_ended(WaitEnd::Left(Leave::TimedOut), 30);
        ds.hold_ended(End::LeaseEnded, 5);
        let counts: Vec<(&str, u64)> = ds.waits().map(|(n, d)| (n, d.count())).filter(|&(_, c)| c > 0).collect();
        assert_eq!(counts, [("granted", 1), ("timeout", 2)]);
        assert_eq!(Distributions::all(ds.waits()).count(), 3);
        assert_eq!(ds.holds().find(|(_, d)| !d.is_empty()).map(|(n, _)| n), Some("expired"));
        assert!(End::ALL.iter().enumerate().all(|(i, e)| e.index() == i));
        let names: Vec<&str> = WaitEnd::ALL.iter().map(|e| e.name()).collect();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names, unique);
    }
}
