//! Measurements: what one run of a scenario reports, and how the repeats
//! of a run are combined.

use crate::stats::median;

/// How the repeats of one measurement combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agg {
    Median,
    /// The largest: for counts of faults and worst cases, which a median
    /// would hide.
    Worst,
}

#[derive(Clone, Copy, Debug)]
pub struct Metric {
    /// Column name, with its unit.
    pub name: &'static str,
    pub agg: Agg,
}

impl Metric {
    pub const fn median(name: &'static str) -> Metric {
        Metric { name, agg: Agg::Median }
    }

    pub const fn worst(name: &'static str) -> Metric {
        Metric { name, agg: Agg::Worst }
    }
}

/// One run: a scenario, a method, a client count, a repeat. NaN: not measurable.
#[derive(Clone, Debug)]
pub struct Sample {
    pub scenario: String,
    pub method: &'static str,
    pub clients: usize,
    pub repeat: usize,
    pub values: Vec<(Metric, f64)>,
}

impl Sample {
    pub fn get(&self, metric: Metric) -> Option<f64> {
        self.values.iter().find(|(m, _)| m.name == metric.name).map(|&(_, v)| v)
    }

    fn same_run(&self, other: &Sample) -> bool {
        (self.scenario == other.scenario) && self.method == other.method && self.clients == other.clients
    }
}

/// The samples of every repeat of one run, combined (the `repeat` field is
/// the number of repeats); in the order the runs were first made.
pub fn combine(samples: &[Sample]) -> Vec<Sample> {
    let mut rows: Vec<Sample> = Vec::new();
    for sample in samples {
        if rows.iter().any(|r| r.same_run(sample)) {
            continue;
        }
        let repeats: Vec<&Sample> = samples.iter().filter(|s| s.same_run(sample)).collect();
        let values = sample
            .values
            .iter()
            .map(|&(metric, _)| {
                let all: Vec<f64> = repeats.iter().filter_map(|s| s.get(metric)).collect();
                let value = match metric.agg {
                    Agg::Median => median(&all),
                    Agg::Worst => all.iter().copied().filter(|v| !v.is_nan()).reduce(f64::max).unwrap_or(f64::NAN),
                };
                (metric, value)
            })
            .collect();
        rows.push(Sample { values, repeat: repeats.len(), ..sample.clone() });
    }
    rows
}
