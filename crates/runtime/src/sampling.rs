//! The sampler chain, in llama.cpp's default order: logit bias, penalties, the grammar
//! constraint (when there is one), top-k, top-p, min-p, temperature, then a seeded draw.
//! A temperature of 0 means greedy (argmax after the penalties), as llama.cpp's temperature sampler does for `temp <= 0`.
//!
//! Every stage is total over its inputs: any finite parameter that `validate` accepts and
//! any logit row (±inf, NaN, huge magnitudes) yields a valid distribution, so the draw
//! never sees a NaN. A NaN logit counts as banned (like -inf), a tiny temperature tends to
//! the argmax as its limit does, and +inf logits share the whole mass.

use std::collections::VecDeque;

use crate::constraint::{Constraint, ConstraintError};

/// Sampling parameters; `validate` names any absurd value.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 selects greedy decoding.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Nucleus threshold in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Drop tokens below `min_p` times the top probability, in [0, 1]; 0 disables.
    pub min_p: f32,
    /// Divides positive logits and multiplies negative ones of recent tokens; 1 disables.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every recent token.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every recent token.
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at, at most [`MAX_PENALTY_WINDOW`]; 0
    /// disables them.
    pub penalty_last_n: usize,
    /// Seed of the draw, for exact reproducibility.
    pub seed: u64,
    /// `(token, bias)` pairs added to the logits before every other stage, greedy
    /// included; a bias of [`LOGIT_BIAS_BAN`] removes the token. Each bias lies in
    /// [-100, 100] and each token appears once.
    pub logit_bias: Vec<(u32, f32)>,
}

/// The logit bias that bans a token outright (OpenAI's "-100 should result in a ban").
pub const LOGIT_BIAS_BAN: f32 = -100.0;

/// The largest magnitude of a logit bias (OpenAI's range is [-100, 100]).
pub const LOGIT_BIAS_MAX: f32 = 100.0;

impl Default for SamplingParams {
    /// llama.cpp's defaults.
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0x5EED,
            logit_bias: Vec::new(),
        }
    }
}

/// Longest penalty window: the counts are recomputed over it at every step.
pub const MAX_PENALTY_WINDOW: usize = 1 << 16;

/// A parameter outside its domain.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    /// The named parameter has a value outside the stated range.
    #[error("invalid {name} {value}: must be {range}")]
    OutOfRange {
        name: &'static str,
        value: String,
        range: &'static str,
    },
}

fn check(name: &'static str, v: f32, ok: bool, range: &'static str) -> Result<(), SamplerError> {
    if ok && v.is_finite() {
        Ok(())
    } else {
        Err(SamplerError::OutOfRange {
            name,
            value: v.to_string(),
            range,
        })
    }
}

impl SamplingParams {
    /// Refuses NaN, infinities and values outside each parameter's range.
    pub fn validate(&self) -> Result<(), SamplerError> {
        let t = self.temperature;
        check("temperature", t, t >= 0.0, "a finite number >= 0")?;
        let p = self.top_p;
        check("top-p", p, p > 0.0 && p <= 1.0, "in (0, 1]")?;
        let m = self.min_p;
        check("min-p", m, (0.0..=1.0).contains(&m), "in [0, 1]")?;
        let r = self.repeat_penalty;
        check("repeat-penalty", r, r > 0.0, "a finite number > 0")?;
        check("presence-penalty", self.presence_penalty, true, "finite")?;
        check("frequency-penalty", self.frequency_penalty, true, "finite")?;
        if self.penalty_last_n > MAX_PENALTY_WINDOW {
            return Err(SamplerError::OutOfRange {
                name: "repeat-last-n",
                value: self.penalty_last_n.to_string(),
                range: "at most 65536 tokens",
            });
        }
        self.validate_logit_bias()
    }

    /// Refuses a logit bias outside [-100, 100] (NaN included) and a token biased twice.
    fn validate_logit_bias(&self) -> Result<(), SamplerError> {
        let mut seen = std::collections::HashSet::with_capacity(self.logit_bias.len());
        for &(t, b) in &self.logit_bias {
            check(
                "logit-bias",
                b,
                (-LOGIT_BIAS_MAX..=LOGIT_BIAS_MAX).contains(&b),
                "in [-100, 100]",
            )?;
            if !seen.insert(t) {
                return Err(SamplerError::OutOfRange {
                    name: "logit-bias",
                    value: format!("token {t} twice"),
                    range: "each token at most once",
                });
            }
        }
        Ok(())
    }

    /// Checks the parameters that depend on the vocabulary: every logit-bias token must
    /// exist, and the bias must leave at least one token that can be sampled.
    pub fn validate_for_vocab(&self, n_vocab: usize) -> Result<(), SamplerError> {
        if let Some(&(t, _)) = self.logit_bias.iter().find(|(t, _)| *t as usize >= n_vocab) {
            return Err(SamplerError::OutOfRange {
                name: "logit-bias",
                value: format!("token {t}"),
                range: "a token id below the vocabulary size",
            });
        }
        let banned = self
            .logit_bias
            .iter()
            .filter(|(_, b)| *b <= LOGIT_BIAS_BAN)
            .count();
        // Ids are distinct and inside the vocabulary (checked above and in `validate`),
        // so this count equals the vocabulary only when every token is banned.
        if n_vocab > 0 && banned >= n_vocab {
            return Err(SamplerError::OutOfRange {
                name: "logit-bias",
                value: format!("a ban on all {n_vocab} tokens"),
                range: "leaving at least one token that can be sampled",
            });
        }
        Ok(())
    }

    /// True when sampling reduces to argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// splitmix64: a small, well-mixed generator; the stream is fixed by the seed alone.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A stateful sampler: the parameters, the penalty window and the random stream.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    /// Masks the logits after the penalties, so that no later stage gives mass to a token
    /// the grammar forbids; advanced with every sampled token.
    constraint: Option<Constraint>,
    recent: VecDeque<u32>,
    rng: Rng,
    cand: Vec<(u32, f32)>,
    /// Reused buffers: the draw allocates nothing once they reach size.
    probs: Vec<f64>,
    counts: Vec<(u32, u32)>,
}

impl Sampler {
    /// A sampler after validating `params`.
    pub fn new(params: SamplingParams) -> Result<Self, SamplerError> {
        params.validate()?;
        let rng = Rng(params.seed);
        // The window is full-size from the start, so accepting tokens never reallocates.
        let window = params.penalty_last_n;
        Ok(Sampler {
            params,
            constraint: None,
            recent: VecDeque::with_capacity(window),
            rng,
            cand: Vec::new(),
            probs: Vec::new(),
            counts: Vec::with_capacity(window),
        })
    }

    /// The parameters in force.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// This sampler with a grammar constraint on every token it samples.
    pub fn with_constraint(mut self, constraint: Option<Constraint>) -> Self {
        self.constraint = constraint;
        self
    }

    /// Whether a grammar constrains the samples.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// [`Sampler::sample`] under the constraint, if any: the allowed-token mask is applied
    /// after the logit bias and the penalties and before every stage that shapes the
    /// distribution, and the chosen token advances the grammar. A grammar failure is an
    /// error, never an unconstrained token.
    pub fn try_sample(&mut self, logits: &mut [f32]) -> Result<u32, ConstraintError> {
        let Some(mut c) = self.constraint.take() else {
            return Ok(self.sample(logits));
        };
        let r = self.sample_masked(logits, &mut c);
        self.constraint = Some(c);
        r
    }

    fn sample_masked(
        &mut self,
        logits: &mut [f32],
        c: &mut Constraint,
    ) -> Result<u32, ConstraintError> {
        self.pre_stages(logits);
        c.mask(logits)?;
        if c.is_active() && !logits.iter().any(|&l| l > f32::NEG_INFINITY) {
            return Err(ConstraintError::Runtime(
                "the grammar allows no token here".into(),
            ));
        }
        let t = match self.shape(logits) {
            Some(t) => t,
            None => {
                let r = self.rng.next_f64();
                self.pick(r)
            }
        };
        c.advance(t)?;
        Ok(t)
    }

    /// The stages before the constraint: logit bias, then penalties.
    fn pre_stages(&mut self, logits: &mut [f32]) {
        if !self.params.logit_bias.is_empty() {
            self.apply_logit_bias(logits);
        }
        if self.penalties_active() {
            self.apply_penalties(logits);
        }
    }

    /// Records a token (prompt or generated) in the penalty window.
    pub fn accept(&mut self, token: u32) {
        if self.params.penalty_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.penalty_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    fn penalties_active(&self) -> bool {
        let p = &self.params;
        p.penalty_last_n > 0
            && !self.recent.is_empty()
            && (p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0)
    }

    fn apply_penalties(&mut self, logits: &mut [f32]) {
        let p = &self.params;
        let counts = &mut self.counts;
        counts.clear();
        for &t in &self.recent {
            match counts.iter_mut().find(|(id, _)| *id == t) {
                Some((_, c)) => *c += 1,
                None => counts.push((t, 1)),
            }
        }
        // In f64, where no product or quotient of finite f32 parameters overflows, so a
        // finite logit never meets `inf - inf`. A finite logit stays finite (saturating at
        // ±f32::MAX): a penalty lowers a token, only a -inf logit (a ban) removes it.
        let (rp, fp, pp) = (
            p.repeat_penalty as f64,
            p.frequency_penalty as f64,
            p.presence_penalty as f64,
        );
        for &(t, c) in counts.iter() {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if !l.is_finite() {
                continue;
            }
            let mut v = *l as f64;
            if v <= 0.0 {
                v *= rp;
            } else {
                v /= rp;
            }
            v -= c as f64 * fp + pp;
            *l = (v as f32).clamp(-f32::MAX, f32::MAX);
        }
    }

    /// Adds each token's bias to its logit; a ban makes the logit -inf so that no later
    /// stage (and no draw) can pick it. Tokens past the row are skipped: the vocabulary
    /// check belongs to `validate_for_vocab`, before sampling starts.
    fn apply_logit_bias(&self, logits: &mut [f32]) {
        for &(t, b) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if b <= LOGIT_BIAS_BAN {
                    f32::NEG_INFINITY
                } else {
                    *l + b
                };
            }
        }
    }

    /// Picks the next token from one row of logits (modified in place by the logit bias
    /// and the penalties). NaN and -inf logits (banned tokens included) are never drawn
    /// unless every logit is one, where the lowest id is returned, as `argmax` does.
    /// The constraint, if any, is not consulted: use [`Sampler::try_sample`] for that.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        if let Some(t) = self.prepare(logits) {
            return t;
        }
        let r = self.rng.next_f64();
        self.pick(r)
    }

    /// The distribution [`Sampler::sample`] would draw from for `logits` (modified in
    /// place as there), as `(token, probability)` pairs with positive mass, without
    /// drawing: a single pair of mass 1 under greedy. Speculative decoding compares the
    /// target's and the draft's distributions with it.
    pub fn distribution(&mut self, logits: &mut [f32]) -> Vec<(u32, f64)> {
        match self.prepare(logits) {
            Some(t) => vec![(t, 1.0)],
            None => self.shaped(),
        }
    }

    /// The distribution the last draw picked `t` from, most likely first, as `(token,
    /// probability)` pairs with positive mass: what is left after the grammar, top-k,
    /// top-p, min-p and the temperature (llama-server's post-sampling probabilities).
    /// Under greedy sampling, `t` alone with mass 1. Call it right after
    /// [`Sampler::sample`] or [`Sampler::try_sample`] returned `t`.
    pub fn drawn_from(&self, t: u32) -> Vec<(u32, f64)> {
        if self.params.is_greedy() {
            return vec![(t, 1.0)];
        }
        self.shaped()
    }

    /// The candidates the last shaping left with positive mass, and their probabilities.
    fn shaped(&self) -> Vec<(u32, f64)> {
        self.cand
            .iter()
            .zip(&self.probs)
            .filter(|(_, &p)| p > 0.0)
            .map(|(c, &p)| (c.0, p))
            .collect()
    }

    /// The next uniform number in [0, 1) of the seeded stream (the acceptance test of
    /// speculative decoding draws from the same stream as the sampler).
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Draws a token from `dist` (`(token, weight)` pairs, weights >= 0, normalised here)
    /// with the seeded stream; the last token with any weight when rounding leaves the
    /// draw above the total, and 0 for an empty or weightless `dist`.
    pub fn draw(&mut self, dist: &[(u32, f64)]) -> u32 {
        let total: f64 = dist.iter().map(|d| d.1).sum();
        let r = self.rng.next_f64() * total;
        let mut cum = 0.0;
        let mut last = None;
        for &(t, w) in dist {
            if w > 0.0 {
                last = Some(t);
                cum += w;
                if r < cum {
                    return t;
                }
            }
        }
        last.unwrap_or(0)
    }

    /// Restarts the random stream at `seed`, keeping the parameters and the penalty window.
    pub fn reseed(&mut self, seed: u64) {
        self.rng = Rng(seed);
    }

    /// Makes this sampler's penalty window a copy of `other`'s (a draft model's sampler
    /// follows the target's history).
    pub fn copy_window_from(&mut self, other: &Sampler) {
        self.recent.clear();
        let skip = other
            .recent
            .len()
            .saturating_sub(self.params.penalty_last_n);
        self.recent.extend(other.recent.iter().skip(skip));
    }

    /// Every stage before the draw: the greedy pick, or `None` with `cand` and `probs`
    /// holding the candidates and their probabilities.
    fn prepare(&mut self, logits: &mut [f32]) -> Option<u32> {
        self.pre_stages(logits);
        self.shape(logits)
    }

    /// The stages after the constraint: the greedy pick, or `None` with `cand` and `probs`
    /// holding what top-k / top-p / min-p / temperature leave.
    fn shape(&mut self, logits: &mut [f32]) -> Option<u32> {
        if self.params.is_greedy() {
            return Some(argmax(logits));
        }
        let p = &self.params;
        let cand = &mut self.cand;
        let probs = &mut self.probs;
        cand.clear();
        // A NaN logit is banned, as in `argmax`; it must not sort above +inf.
        let ban_nan = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { l };
        cand.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, ban_nan(l))),
        );
        // Stable descending order: ties keep the lower id first, as argmax does.
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, by_logit);
            cand.truncate(p.top_k);
        }
        cand.sort_by(by_logit);
        if p.top_p < 1.0 {
            softmax(cand, 1.0, probs);
            let mut cum = 0.0;
            let mut keep = cand.len();
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 && !cand.is_empty() {
            let max = cand[0].1;
            let floor = max + p.min_p.ln();
            let keep = cand.iter().take_while(|c| c.1 >= floor).count();
            cand.truncate(keep.max(1));
        }
        // The temperature scales inside the softmax, in f64: dividing f32 logits by a tiny
        // temperature would overflow them to infinities and the softmax to NaN.
        softmax(cand, p.temperature, probs);
        None
    }

    /// The candidate the uniform number `r` selects from `cand` and `probs`.
    fn pick(&self, r: f64) -> u32 {
        let mut cum = 0.0;
        let mut last = 0;
        for (i, &pr) in self.probs.iter().enumerate() {
            if pr > 0.0 {
                last = i;
                cum += pr;
                if r < cum {
                    return self.cand[i].0;
                }
            }
        }
        // Rounding left `r` above the final sum: the last token with any mass, never a
        // banned one. (An empty row has no token at all; 0, as `argmax` answers.)
        self.cand.get(last).map_or(0, |c| c.0)
    }
}

/// Index of the largest logit; the lowest index wins ties (NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

/// Probabilities of NaN-free candidates at temperature `temp > 0` into `out`, in f64 so the
/// cumulative sums are stable. Always a distribution: +inf logits share the mass equally;
/// when every logit is -inf the first candidate (the lowest id after sorting) gets it all.
fn softmax(cand: &[(u32, f32)], temp: f32, out: &mut Vec<f64>) {
    out.clear();
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::INFINITY {
        out.extend(
            cand.iter()
                .map(|c| f64::from(u8::from(c.1 == f32::INFINITY))),
        );
    } else if max == f32::NEG_INFINITY {
        out.extend((0..cand.len()).map(|i| f64::from(u8::from(i == 0))));
    } else {
        // `l - max` is finite and <= 0 and `temp` is a positive finite f32, so the exponent
        // is a finite non-positive f64 (or -inf for a banned token): no overflow, and the
        // top logit contributes exactly 1, so the sum is at least 1.
        let (max, temp) = (max as f64, temp as f64);
        out.extend(cand.iter().map(|c| ((c.1 as f64 - max) / temp).exp()));
    }
    let sum: f64 = out.iter().sum();
    for e in out.iter_mut() {
        *e /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn drawn_from_is_what_the_filters_left_with_the_drawn_token_in_it() {
        let logits = [0.5f32, 2.0, 1.0, -1.0, 3.0];
        let mut s = Sampler::new(SamplingParams {
            top_k: 3,
            seed: 9,
            ..params()
        })
        .unwrap();
        for _ in 0..20 {
            let t = s.sample(&mut logits.clone());
            let d = s.drawn_from(t);
            let ids: Vec<u32> = d.iter().map(|x| x.0).collect();
            assert_eq!(ids, [4, 1, 2], "the top three, most likely first");
            assert!((d.iter().map(|x| x.1).sum::<f64>() - 1.0).abs() < 1e-12);
            assert!(ids.contains(&t));
        }
        let mut g = Sampler::new(SamplingParams {
            temperature: 0.0,
            ..params()
        })
        .unwrap();
        let t = g.sample(&mut logits.clone());
        assert_eq!((t, g.drawn_from(t)), (4, vec![(4, 1.0)]));
    }

    #[test]
    fn validation_names_the_parameter() {
        let bad = [
            (
                SamplingParams {
                    temperature: -0.1,
                    ..params()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..params()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..params()
                },
                "top-p",
            ),
            (
                SamplingParams {
                    top_p: 1.5,
                    ..params()
                },
                "top-p",
            ),
            (
                SamplingParams {
                    min_p: -1.0,
                    ..params()
                },
                "min-p",
            ),
            (
                SamplingParams {
                    repeat_penalty: 0.0,
                    ..params()
                },
                "repeat-penalty",
            ),
            (
                SamplingParams {
                    penalty_last_n: MAX_PENALTY_WINDOW + 1,
                    ..params()
                },
                "repeat-last-n",
            ),
        ];
        for (p, name) in bad {
            let e = Sampler::new(p).unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        }
        assert!(Sampler::new(params()).is_ok());
    }

    #[test]
    fn greedy_is_argmax_with_lowest_index_on_ties() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            ..params()
        })
        .unwrap();
        assert_eq!(s.sample(&mut [0.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
        // An empty row panics nowhere in the chain.
        assert_eq!(s.sample(&mut []), 0);
        let mut s = Sampler::new(SamplingParams {
            min_p: 0.5,
            ..params()
        })
        .unwrap();
        assert_eq!(s.sample(&mut []), 0);
    }

    #[test]
    fn penalties_follow_llama_cpp() {
        let p = SamplingParams {
            temperature: 0.0,
            repeat_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..params()
        };
        let mut s = Sampler::new(p).unwrap();
        for t in [0, 0, 1] {
            s.accept(t);
        }
        let mut l = [4.0, -2.0, 1.0];
        s.apply_penalties(&mut l);
        assert_eq!(l, [4.0 / 2.0 - 0.5 - 0.5, -2.0 * 2.0 - 0.25 - 0.5, 1.0]);
    }

    #[test]
    fn penalty_window_is_bounded() {
        let mut s = Sampler::new(SamplingParams {
            penalty_last_n: 2,
            ..params()
        })
        .unwrap();
        for t in [1, 2, 3] {
            s.accept(t);
        }
        assert_eq!(s.recent.iter().copied().collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn top_k_one_is_greedy_and_seed_reproduces() {
        let mut s = Sampler::new(SamplingParams {
            top_k: 1,
            ..params()
        })
        .unwrap();
        assert_eq!(s.sample(&mut [0.1, 0.2, 5.0, 0.3]), 2);
        let logits: Vec<f32> = (0..50).map(|i| ((i * 7919) % 13) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams { seed, ..params() }).unwrap();
            (0..20)
                .map(|_| s.sample(&mut logits.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // Probabilities about 0.64, 0.24, 0.09, 0.03: top-p 0.7 keeps two tokens.
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let mut s = Sampler::new(SamplingParams {
            top_p: 0.7,
            ..params()
        })
        .unwrap();
        for _ in 0..200 {
            assert!(s.sample(&mut logits.clone()) < 2);
        }
        // min-p 0.3 keeps tokens with p >= 0.3 * 0.64: again the first two.
        let mut s = Sampler::new(SamplingParams {
            min_p: 0.3,
            ..params()
        })
        .unwrap();
        let mut seen = [false; 4];
        for _ in 0..400 {
            seen[s.sample(&mut logits.clone()) as usize] = true;
        }
        assert_eq!(seen, [true, true, false, false]);
    }

    #[test]
    fn draws_follow_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()];
        let mut s = Sampler::new(params()).unwrap();
        let n = 4000;
        let ones = (0..n)
            .filter(|_| s.sample(&mut logits.clone()) == 1)
            .count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.03, "{frac}");
    }

    #[test]
    fn logit_bias_applies_before_greedy_and_bans_at_minus_100() {
        let greedy = |bias: Vec<(u32, f32)>| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 0.0,
                logit_bias: bias,
                ..params()
            })
            .unwrap();
            s.sample(&mut [1.0, 5.0, 3.0, 4.9])
        };
        assert_eq!(greedy(vec![]), 1);
        // A positive bias lifts a token past the best one; a small negative one demotes.
        assert_eq!(greedy(vec![(2, 2.5)]), 2);
        assert_eq!(greedy(vec![(1, -0.2)]), 3);
        // -100 is a ban, even for a logit far above every other.
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            logit_bias: vec![(0, LOGIT_BIAS_BAN)],
            ..params()
        })
        .unwrap();
        assert_eq!(s.sample(&mut [1000.0, 5.0, 3.0]), 1);
    }

    #[test]
    fn banned_tokens_are_never_drawn() {
        let logits = [2.0f32, 2.0, 2.0, 2.0];
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(1, LOGIT_BIAS_BAN), (3, LOGIT_BIAS_BAN)],
            ..params()
        })
        .unwrap();
        let mut seen = [false; 4];
        for _ in 0..400 {
            seen[s.sample(&mut logits.clone()) as usize] = true;
        }
        assert_eq!(seen, [true, false, true, false]);
    }

    #[test]
    fn logit_bias_is_validated() {
        let with = |bias: Vec<(u32, f32)>| SamplingParams {
            logit_bias: bias,
            ..params()
        };
        for bad in [
            vec![(1, 100.5)],
            vec![(1, f32::NAN)],
            vec![(1, 1.0), (1, 2.0)],
        ] {
            let e = Sampler::new(with(bad)).unwrap_err().to_string();
            assert!(e.contains("logit-bias"), "{e}");
        }
        assert!(Sampler::new(with(vec![(1, -100.0), (2, 100.0)])).is_ok());
        let e = with(vec![(4, 1.0)]).validate_for_vocab(4).unwrap_err();
        assert!(e.to_string().contains("token 4"), "{e}");
        let all = with((0..4).map(|t| (t, LOGIT_BIAS_BAN)).collect());
        let e = all.validate_for_vocab(4).unwrap_err();
        assert!(e.to_string().contains("all 4 tokens"), "{e}");
        assert!(all.validate_for_vocab(5).is_ok());
    }

    /// Logit rows that stress the chain: ordinary, all equal, huge magnitudes, ±inf, NaN,
    /// every token but one banned with -inf.
    fn hostile_rows() -> Vec<Vec<f32>> {
        let (inf, max) = (f32::INFINITY, f32::MAX);
        let mut rng = Rng(11);
        let random: Vec<f32> = (0..24)
            .map(|_| (rng.next_f64() * 20.0 - 10.0) as f32)
            .collect();
        vec![
            random,
            vec![0.5; 9],
            vec![max, -max, max / 2.0, 0.0, -1.0, 1e-30],
            vec![1.0, inf, 2.0, -inf, inf, 0.0],
            vec![-inf, -inf, 3.0, -inf, -inf],
            vec![-inf, -inf, -inf, -7.0],
            vec![f32::NAN, 1.0, -inf, f32::NAN, 0.0],
            vec![f32::MIN_POSITIVE, -f32::MIN_POSITIVE, 1e-45, 0.0],
        ]
    }

    /// A token the row allows: neither banned (-inf) nor NaN.
    fn allowed(row: &[f32], t: u32) -> bool {
        row.get(t as usize)
            .is_some_and(|&l| !l.is_nan() && l != f32::NEG_INFINITY)
    }

    #[test]
    fn tiny_temperatures_behave_like_greedy() {
        let mut rng = Rng(3);
        for t in [1e-45f32, 1e-40, f32::MIN_POSITIVE, 1e-30, 1e-12] {
            let mut s = Sampler::new(SamplingParams {
                temperature: t,
                ..params()
            })
            .unwrap();
            for _ in 0..200 {
                // Distinct logits over a wide range, so the limit has a single argmax.
                let row: Vec<f32> = (0..32)
                    .map(|_| ((rng.next_f64() - 0.5) * 1e6) as f32)
                    .collect();
                assert_eq!(
                    s.sample(&mut row.clone()),
                    argmax(&row),
                    "temperature {t:e}"
                );
            }
        }
    }

    #[test]
    fn no_parameter_or_logit_yields_nan_or_a_banned_token() {
        let max = f32::MAX;
        let rows = hostile_rows();
        let mut cases = 0usize;
        for temperature in [1e-45f32, f32::MIN_POSITIVE, 1e-3, 1.0, 1e38, max] {
            for repeat_penalty in [1e-45f32, f32::MIN_POSITIVE, 1.0, 1e38, max] {
                for (presence_penalty, frequency_penalty) in [
                    (0.0, 0.0),
                    (max, max),
                    (-max, -max),
                    (max, -max),
                    (-1e-45, 1e38),
                ] {
                    for (top_k, top_p, min_p) in [
                        (0, 1.0, 0.0),
                        (1, 1.0, 0.0),
                        (3, 0.5, 0.05),
                        (0, f32::MIN_POSITIVE, 0.0),
                        (0, 1.0, f32::MIN_POSITIVE),
                        (0, 1.0, 1.0),
                        (2, 1e-45, 1e-45),
                    ] {
                        let p = SamplingParams {
                            temperature,
                            top_k,
                            top_p,
                            min_p,
                            repeat_penalty,
                            presence_penalty,
                            frequency_penalty,
                            penalty_last_n: 8,
                            seed: cases as u64,
                            // The largest bias on a token, every other case.
                            logit_bias: if cases % 2 == 1 {
                                vec![(1, LOGIT_BIAS_MAX)]
                            } else {
                                Vec::new()
                            },
                        };
                        let mut s = Sampler::new(p.clone()).unwrap();
                        for t in [0, 1, 1, 2, 5] {
                            s.accept(t);
                        }
                        for row in &rows {
                            let t = s.sample(&mut row.clone());
                            cases += 1;
                            assert!((t as usize) < row.len(), "{t} out of range: {p:?} {row:?}");
                            if row.iter().any(|&l| !l.is_nan() && l != f32::NEG_INFINITY) {
                                assert!(allowed(row, t), "banned {t}: {p:?} {row:?}");
                            }
                            assert!(
                                s.probs.iter().all(|q| q.is_finite() && *q >= 0.0),
                                "probabilities {:?}: {p:?} {row:?}",
                                s.probs
                            );
                            let sum: f64 = s.probs.iter().sum();
                            assert!(
                                s.probs.is_empty() || (sum - 1.0).abs() < 1e-9,
                                "sum {sum}: {p:?} {row:?}"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 6 * 5 * 5 * 7 * rows.len(), "every combination ran");
    }

    #[test]
    fn greedy_never_picks_a_banned_or_nan_token() {
        let rows = hostile_rows();
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            repeat_penalty: 1e-45,
            frequency_penalty: f32::MAX,
            ..params()
        })
        .unwrap();
        for t in [0, 1, 2] {
            s.accept(t);
        }
        for row in &rows {
            let t = s.sample(&mut row.clone());
            assert!(allowed(row, t), "{t} in {row:?}");
        }
    }

    #[test]
    fn positive_infinities_share_the_mass_and_all_equal_logits_are_uniform() {
        let inf = f32::INFINITY;
        let mut s = Sampler::new(params()).unwrap();
        let mut seen = [0usize; 5];
        for _ in 0..400 {
            seen[s.sample(&mut [1.0, inf, 2.0, inf, -inf]) as usize] += 1;
        }
        assert_eq!([seen[0], seen[2], seen[4]], [0, 0, 0], "{seen:?}");
        assert!(seen[1] > 120 && seen[3] > 120, "{seen:?}");
        // A huge temperature flattens the distribution instead of overflowing.
        let mut s = Sampler::new(SamplingParams {
            temperature: f32::MAX,
            ..params()
        })
        .unwrap();
        s.sample(&mut [0.0, 1.0, 2.0, 3.0]);
        for q in &s.probs {
            assert!((q - 0.25).abs() < 1e-9, "{:?}", s.probs);
        }
    }

    #[test]
    fn non_finite_parameters_are_refused_by_the_constructor() {
        let inf = f32::INFINITY;
        let bad = [
            (
                SamplingParams {
                    temperature: inf,
                    ..params()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: f32::NAN,
                    ..params()
                },
                "top-p",
            ),
            (
                SamplingParams {
                    min_p: inf,
                    ..params()
                },
                "min-p",
            ),
            (
                SamplingParams {
                    repeat_penalty: inf,
                    ..params()
                },
                "repeat-penalty",
            ),
            (
                SamplingParams {
                    presence_penalty: -inf,
                    ..params()
                },
                "presence-penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: f32::NAN,
                    ..params()
                },
                "frequency-penalty",
            ),
        ];
        for (p, name) in bad {
            let e = Sampler::new(p).unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        }
    }
}
