//! `serve`'s sampling flags, llama-server's: defaults for every request that leaves a
//! setting out (model cards give these, e.g. `--temp 0.6 --top-k 20 --top-p 0.95`).

use minfer_server::sampling_defaults::SamplingDefaults;

use super::common::usize_in;

/// Sampling defaults of `minfer serve`; each applies to requests that do not set it.
#[derive(clap::Args, Debug, Default)]
pub struct SamplingFlags {
    /// Temperature of requests that give none (0: greedy).
    #[arg(
        long = "temp",
        visible_alias = "temperature",
        allow_negative_numbers = true
    )]
    pub temp: Option<f32>,
    /// Top-k of requests that give none (0: off).
    #[arg(long = "top-k")]
    pub top_k: Option<usize>,
    /// Top-p of requests that give none, in (0, 1].
    #[arg(long = "top-p", allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Min-p of requests that give none, in [0, 1].
    #[arg(long = "min-p", allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Repetition penalty of requests that give none (1: off).
    #[arg(long = "repeat-penalty", allow_negative_numbers = true)]
    pub repeat_penalty: Option<f32>,
    /// Tokens the penalties look back over, for requests that give none (0..=65536).
    #[arg(long = "repeat-last-n", value_parser = usize_in(0..=minfer_runtime::sampling::MAX_PENALTY_WINDOW as u64))]
    pub repeat_last_n: Option<usize>,
    /// Presence penalty of requests that give none.
    #[arg(long = "presence-penalty", allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty of requests that give none.
    #[arg(long = "frequency-penalty", allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// Seed of requests that give none; -1 (the default): a fresh random one each.
    #[arg(short = 's', long = "seed", default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
}

impl SamplingFlags {
    /// The server's defaults; a seed below -1 is refused by name.
    pub fn defaults(&self) -> anyhow::Result<SamplingDefaults> {
        let seed = match self.seed {
            -1 => None,
            s if s >= 0 => Some(s as u64),
            s => anyhow::bail!("invalid --seed: {s} is not -1 (random) or a seed >= 0"),
        };
        Ok(SamplingDefaults {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
        })
    }
}
