//! The adaptive depth: the measured (or estimated) costs of drafting and verifying, the
//! measured acceptance per class, and the depth that maximises the expected tokens per
//! second, 0 (plain decode) included.

use super::lookup::NGRAM_MAX;
use crate::engine::EngineError;

/// Largest draft length `--draft-max` accepts: one less than the largest verify block
/// the engine sizes its sliding-window rings for (the draft plus the token it follows).
pub const DRAFT_MAX_LIMIT: usize = crate::engine::MAX_VERIFY_BLOCK - 1;

/// The default draft length cap: verify blocks of up to 8 tokens.
pub const DEFAULT_DRAFT_MAX: usize = 7;

/// The draft depths used with a cap of `max` (0, plain decode, is always allowed too):
/// verify widths of 2, 4, 8 and 16 tokens, the widths the quantized matmul kernels take
/// in whole passes of four, plus `max` itself.
pub fn depth_set(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [1, 3, 7, 15].into_iter().filter(|&d| d <= max).collect();
    if max > 0 && !v.contains(&max) {
        v.push(max);
    }
    v
}

/// Checks a draft length cap, naming the flag.
pub fn check_draft_max(max: usize) -> Result<(), EngineError> {
    if max == 0 || max > DRAFT_MAX_LIMIT {
        return Err(EngineError::Param {
            name: "--draft-max",
            message: format!("{max} is not in 1..={DRAFT_MAX_LIMIT}"),
        });
    }
    Ok(())
}

/// Weight of a new sample in the moving averages.
const EWMA: f64 = 0.15;

/// Plain steps between probes of drafting while the model says it does not pay, at
/// first (lookup; a draft model's probes cost a catch-up, so it waits longer); each
/// probe that still does not pay doubles it, up to [`PROBE_MAX`].
const PROBE_MIN: u32 = 16;
const PROBE_MIN_MODEL: u32 = 64;
const PROBE_MAX: u32 = 512;

/// Acceptance classes: 0 for a draft model, the n-gram length for lookup.
const CLASSES: usize = NGRAM_MAX + 1;

/// The measured costs and acceptance behind the depth choice.
#[derive(Debug, Clone)]
pub(super) struct Controller {
    depths: Vec<usize>,
    /// Seconds of a target forward of `depths[i] + 1` tokens, once measured.
    verify: Vec<Option<f64>>,
    /// Seconds of a plain one-token step, once measured.
    plain: Option<f64>,
    /// Seconds per drafted token (draft-model catch-up included).
    draft: f64,
    /// Per class, the probability that a drafted token is accepted given the ones before
    /// it were.
    alpha: [f64; CLASSES],
    /// Plain steps left before the next probe, and the current probe interval.
    until_probe: u32,
    interval: u32,
    min_interval: u32,
    /// Index into `depths` of the deepest depth allowed now: it starts at the smallest
    /// and grows one setting at a time, each time a block at the deepest allowed depth is
    /// accepted whole, so a deep block is only ever risked after measured success.
    level: usize,
    /// Whether the depth just allowed has its verify cost still unmeasured: it is tried
    /// once (an estimate alone would never be corrected).
    explore: bool,
    /// Whether the costs are fixed estimates that no timing updates (see
    /// [`Controller::fix_costs`]): the depth then follows the acceptance alone.
    fixed_costs: bool,
}

/// The acceptance every class starts from: pessimistic, so that nothing is drafted on
/// faith (at these costs, a depth-1 block pays from about 35% acceptance); the first
/// probes measure it, and drafting grows only on measured acceptance.
const ALPHA_PRIOR: f64 = 0.3;

/// How much faster than plain decode a depth must be expected to run to be chosen: near
/// break-even the noise of the estimates would make drafting lose as often as it wins.
const PAY_MARGIN: f64 = 1.05;

/// What a verify width costs before it is measured: a plain step plus this share of one
/// per extra token (measured on CPU: widths 2, 4 and 8 cost 1.3, 1.7 and 3.3 steps).
const EXTRA_TOKEN_COST: f64 = 0.3;

impl Controller {
    /// A controller choosing among [`depth_set`]`(max)`, probing less often for a source
    /// that runs a model.
    pub(super) fn new(max: usize, runs_model: bool) -> Self {
        let depths = depth_set(max);
        let n = depths.len();
        Controller {
            depths,
            verify: vec![None; n],
            plain: None,
            draft: 0.0,
            alpha: [ALPHA_PRIOR; CLASSES],
            until_probe: 0,
            interval: if runs_model {
                PROBE_MIN_MODEL
            } else {
                PROBE_MIN
            },
            min_interval: if runs_model {
                PROBE_MIN_MODEL
            } else {
                PROBE_MIN
            },
            level: 0,
            explore: false,
            fixed_costs: false,
        }
    }

    /// Replaces the measured costs by estimates in units of a plain step: a draft step
    /// costs `draft_ratio` of one (the share of the target's weight bytes it reads) and a
    /// verify width the [`EXTRA_TOKEN_COST`] model. From then on no timing moves a
    /// choice, so the choices, and with them every random draw, are a function of the
    /// seed and the text alone.
    pub(super) fn fix_costs(&mut self, draft_ratio: f64) {
        self.fixed_costs = true;
        self.plain = Some(1.0);
        self.draft = draft_ratio;
        self.verify.iter_mut().for_each(|v| *v = None);
        self.explore = false;
    }

    /// The deepest depth allowed: the cap the controller was made with.
    pub(super) fn max_depth(&self) -> usize {
        self.depths.last().copied().unwrap_or(0)
    }

    /// Whether the costs are fixed estimates (see [`Self::fix_costs`]).
    pub(super) fn fixed_costs(&self) -> bool {
        self.fixed_costs
    }

    /// Records the measured seconds per drafted token of a proposal (ignored once the
    /// costs are fixed).
    pub(super) fn record_draft(&mut self, per_token: f64) {
        if self.fixed_costs {
            return;
        }
        if self.draft == 0.0 {
            self.draft = per_token;
        } else {
            Self::ewma(&mut self.draft, per_token);
        }
    }

    fn verify_cost(&self, i: usize) -> f64 {
        let plain = self.plain.unwrap_or(1.0);
        self.verify[i].unwrap_or(plain * (1.0 + EXTRA_TOKEN_COST * self.depths[i] as f64))
    }

    /// Expected tokens per second of depth `depths[i]` for acceptance class `class`.
    fn rate(&self, i: usize, class: usize) -> f64 {
        let a = self.alpha[class].clamp(0.0, 0.999);
        let d = self.depths[i];
        let tokens = (1.0 - a.powi(d as i32 + 1)) / (1.0 - a);
        tokens / (self.verify_cost(i) + self.draft * d as f64)
    }

    /// The depth to draft for `class` with at most `avail` tokens available.
    pub(super) fn choose(&mut self, class: usize, avail: usize) -> usize {
        // Every estimate is relative to a plain step: measure one first.
        let Some(plain) = self.plain else {
            return 0;
        };
        if std::mem::take(&mut self.explore) {
            if let Some(&d) = self.depths.get(self.level).filter(|&&d| d <= avail) {
                return d;
            }
        }
        let plain_rate = 1.0 / plain;
        let mut best = (0, plain_rate * PAY_MARGIN);
        for i in 0..=self.level.min(self.depths.len().saturating_sub(1)) {
            if self.depths[i] > avail {
                break;
            }
            let r = self.rate(i, class);
            if r > best.1 {
                best = (self.depths[i], r);
            }
        }
        if best.0 > 0 {
            self.interval = self.min_interval;
            return best.0;
        }
        // Not drafting: re-measure now and then, in case the text became predictable.
        if self.until_probe == 0 && avail >= self.depths.first().copied().unwrap_or(usize::MAX) {
            self.until_probe = self.interval;
            self.interval = (self.interval * 2).min(PROBE_MAX);
            return self.depths[0];
        }
        self.until_probe = self.until_probe.saturating_sub(1);
        0
    }

    fn ewma(old: &mut f64, new: f64) {
        *old += EWMA * (new - *old);
    }

    /// Records the seconds of a target forward that verified `depth` drafted tokens (a
    /// plain step for 0).
    pub(super) fn record_verify(&mut self, depth: usize, secs: f64) {
        if self.fixed_costs {
            return;
        }
        if depth == 0 {
            match &mut self.plain {
                Some(p) => Self::ewma(p, secs),
                None => self.plain = Some(secs),
            }
        } else if let Some(i) = self.depths.iter().position(|&d| d == depth) {
            match &mut self.verify[i] {
                Some(v) => Self::ewma(v, secs),
                None => self.verify[i] = Some(secs),
            }
        }
    }

    /// Records that `accepted` of `drafted` tokens of class `class` were accepted, and
    /// moves the deepest allowed depth accordingly.
    pub(super) fn record_accept(&mut self, class: usize, drafted: usize, accepted: usize) {
        let a = &mut self.alpha[class.min(CLASSES - 1)];
        for i in 0..drafted.min(accepted + 1) {
            Self::ewma(a, if i < accepted { 1.0 } else { 0.0 });
        }
        let top = self.depths.get(self.level).copied().unwrap_or(0);
        if drafted >= top && accepted == drafted {
            let up = (self.level + 1).min(self.depths.len().saturating_sub(1));
            self.explore = up != self.level && self.verify[up].is_none();
            self.level = up;
        } else if accepted == 0 {
            // A block lost whole: back to the smaller depths until blocks succeed again.
            self.level = self.level.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_depth_set_is_small_and_capped() {
        assert_eq!(depth_set(7), vec![1, 3, 7]);
        assert_eq!(depth_set(5), vec![1, 3, 5]);
        assert_eq!(depth_set(16), vec![1, 3, 7, 15, 16]);
        assert!(check_draft_max(0)
            .unwrap_err()
            .to_string()
            .contains("--draft-max"));
        assert!(check_draft_max(17)
            .unwrap_err()
            .to_string()
            .contains("--draft-max"));
    }

    #[test]
    fn drafting_stops_when_it_does_not_pay_and_is_probed_again() {
        let mut c = Controller::new(7, true);
        assert_eq!(c.choose(0, 7), 0, "a plain step is measured first");
        c.plain = Some(1.0);
        c.draft = 0.9;
        for i in 0..3 {
            c.verify[i] = Some(1.0 + 0.3 * c.depths[i] as f64);
        }
        c.alpha[0] = 0.1;
        // A probe first (the interval starts elapsed), then plain steps until the next.
        assert_eq!(c.choose(0, 7), 1);
        let plain = (0..PROBE_MIN_MODEL).filter(|_| c.choose(0, 7) == 0).count();
        assert_eq!(plain as u32, PROBE_MIN_MODEL);
        // A cheap, accurate draft drafts deep, once blocks were accepted whole.
        c.draft = 0.01;
        c.alpha[0] = 0.95;
        assert_eq!(
            c.choose(0, 7),
            1,
            "a deep block only after measured success"
        );
        c.record_accept(0, 1, 1);
        assert_eq!(c.choose(0, 7), 3);
        c.record_accept(0, 3, 3);
        assert_eq!(c.choose(0, 7), 7);
        assert_eq!(c.choose(0, 3), 3);
    }

    /// The depth choices of `c` over a fixed pattern of acceptance, each block's timing
    /// drawn from `timing` (seconds of a verify of `d` drafted tokens, step `i`).
    fn choices(mut c: Controller, timing: impl Fn(usize, usize) -> f64) -> Vec<usize> {
        let mut out = Vec::new();
        for i in 0..200 {
            let d = c.choose(0, 7);
            c.record_verify(d, timing(d, i));
            if d > 0 {
                // Whole blocks mostly, a lost one every seventh step.
                let accepted = if i % 7 == 3 { 0 } else { d };
                c.record_accept(0, d, accepted);
            }
            out.push(d);
        }
        out
    }

    #[test]
    fn with_fixed_costs_timings_never_move_the_depth() {
        let fixed = || {
            let mut c = Controller::new(7, true);
            c.fix_costs(0.3);
            c
        };
        let steady = |d: usize, _| 1.0 + 0.3 * d as f64;
        // A machine that slows down wide verifies now and then (another process, a
        // frequency change): measured costs follow it.
        let noisy = |d: usize, i: usize| {
            (1.0 + 0.3 * d as f64) * if i.is_multiple_of(5) { 3.0 } else { 1.0 }
        };
        assert_eq!(choices(fixed(), steady), choices(fixed(), noisy));
        assert!(choices(fixed(), steady).iter().any(|&d| d > 0), "it drafts");
        // Without fixed costs the same noise changes the choices: the test can fail.
        let measured = || {
            let mut c = Controller::new(7, true);
            c.draft = 0.3;
            c
        };
        assert_ne!(choices(measured(), steady), choices(measured(), noisy));
    }

    /// Decodes `n` tokens under the controller with simulated costs (a plain step costs
    /// 1, a verify of `d` drafted tokens `verify(d)`, each drafted token `draft`) and a
    /// source whose drafted tokens are each right with probability `accept` (a fixed
    /// pseudo-random stream). Returns the time per token against plain decode's 1, and
    /// the deepest depth used.
    fn simulate(
        runs_model: bool,
        accept: f64,
        verify: impl Fn(usize) -> f64,
        draft: f64,
        n: usize,
    ) -> (f64, usize) {
        let mut c = Controller::new(7, runs_model);
        // Lookup drafts from 4-gram matches here; a draft model has one class.
        let class = if runs_model { 0 } else { NGRAM_MAX };
        let mut rng = minfer_testkit::Rng::new(0x9E37_79B9_7F4A_7C15);
        let mut uniform = move || f64::from(rng.unit());
        let (mut time, mut tokens, mut deepest) = (0.0, 0, 0);
        while tokens < n {
            let d = c.choose(class, 7);
            deepest = deepest.max(d);
            let v = if d == 0 { 1.0 } else { verify(d) };
            c.record_verify(d, v);
            time += v + draft * d as f64;
            let mut acc = 0;
            while acc < d && uniform() < accept {
                acc += 1;
            }
            if d > 0 {
                // The speculator measures a draft token's cost from its second proposal.
                if runs_model && c.draft == 0.0 && deepest > 0 && time > v + 1.0 {
                    c.draft = draft;
                }
                c.record_accept(class, d, acc);
            }
            tokens += acc + 1;
        }
        (time / tokens as f64, deepest)
    }

    /// What verify widths 2, 4 and 8 cost on the CPU measured (1.3, 1.7, 3.3 steps).
    fn cpu_verify(d: usize) -> f64 {
        match d {
            1 => 1.3,
            2..=3 => 1.7,
            _ => 3.3,
        }
    }

    #[test]
    fn a_source_that_is_never_right_costs_at_most_a_few_percent() {
        // 96 tokens, the length the benchmarks decode: the start-up must be cheap too.
        for (runs_model, draft) in [(false, 0.0), (true, 0.4)] {
            let (ratio, _) = simulate(runs_model, 0.0, cpu_verify, draft, 96);
            assert!(
                ratio <= 1.03,
                "model {runs_model}: {ratio:.3} of plain decode's time per token"
            );
            let (ratio, _) = simulate(runs_model, 0.0, cpu_verify, draft, 2000);
            assert!(ratio <= 1.02, "model {runs_model}, long run: {ratio:.3}");
        }
    }

    #[test]
    fn a_source_that_is_mostly_right_reaches_the_deep_setting() {
        // Where a wide verify costs little more than a step (a memory-bound host), 90%
        // acceptance pays at the deepest setting; on the measured CPU, depth 3 wins.
        let cheap = |d: usize| 1.0 + 0.1 * d as f64;
        for runs_model in [false, true] {
            let draft = if runs_model { 0.05 } else { 0.0 };
            let (ratio, deepest) = simulate(runs_model, 0.9, cheap, draft, 200);
            assert_eq!(deepest, 7, "model {runs_model}");
            assert!(ratio < 0.5, "model {runs_model}: {ratio:.3}");
        }
        let (ratio, deepest) = simulate(false, 0.9, cpu_verify, 0.0, 200);
        assert!(deepest >= 3 && ratio < 0.7, "{deepest} {ratio:.3}");
    }
}
