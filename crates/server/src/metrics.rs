//! Server counters, gauges and latency histograms, rendered as Prometheus text: under
//! minfer's own `minfer_*` names, under llama-server's `llamacpp:*` names, and under
//! vLLM's `vllm:*` names (`vllm.rs`).

mod vllm;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A cumulative histogram with fixed upper bounds, in seconds.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, secs: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| secs <= b) {
            self.counts[i] += 1;
        }
        self.sum += secs;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

const TTFT_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const ITL_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Everything `/metrics` reports; shared by the HTTP side and the inference worker.
#[derive(Debug)]
pub struct Metrics {
    requests: Mutex<BTreeMap<u16, u64>>,
    prompt_tokens: AtomicU64,
    prefill_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    busy_nanos: AtomicU64,
    busy_slots: AtomicUsize,
    queue_len: AtomicUsize,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
    /// Nanoseconds spent processing prompts, summed over requests.
    prompt_nanos: AtomicU64,
    /// Nanoseconds spent generating, summed over requests.
    predicted_nanos: AtomicU64,
    /// Engine steps run.
    decodes: AtomicU64,
    /// Sequences in those steps, summed.
    decode_seqs: AtomicU64,
    /// Tokens whose KV the slots hold, and the positions they have in all.
    kv_tokens: AtomicUsize,
    kv_capacity: AtomicUsize,
    /// The most positions one slot has held.
    kv_high: AtomicUsize,
    /// Tokens drafted by speculative decoding, those the model accepted, and the steps
    /// that verified a draft.
    drafted: AtomicU64,
    accepted: AtomicU64,
    draft_steps: AtomicU64,
    /// Speculative blocks of a recurrent model undone after a rejected draft.
    rewinds: AtomicU64,
    /// Prompt tokens whose KV rows came from the shared prompt cache.
    cache_hits: AtomicU64,
    /// Bytes of rows the shared prompt cache holds.
    cache_bytes: AtomicUsize,
    /// Positions per block of the shared prompt cache; 0 while it is off.
    cache_block: AtomicUsize,
    /// Bytes the slots' recurrent state checkpoints hold, and the prompts that went on
    /// from one.
    checkpoint_bytes: AtomicU64,
    checkpoint_restores: AtomicU64,
    /// When the counters started, in seconds since the Unix epoch.
    started_unix: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            prefill_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            busy_nanos: AtomicU64::new(0),
            busy_slots: AtomicUsize::new(0),
            queue_len: AtomicUsize::new(0),
            ttft: Mutex::new(Histogram::new(TTFT_BOUNDS)),
            itl: Mutex::new(Histogram::new(ITL_BOUNDS)),
            prompt_nanos: AtomicU64::new(0),
            predicted_nanos: AtomicU64::new(0),
            decodes: AtomicU64::new(0),
            decode_seqs: AtomicU64::new(0),
            kv_tokens: AtomicUsize::new(0),
            kv_capacity: AtomicUsize::new(0),
            kv_high: AtomicUsize::new(0),
            drafted: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            draft_steps: AtomicU64::new(0),
            rewinds: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            cache_bytes: AtomicUsize::new(0),
            cache_block: AtomicUsize::new(0),
            checkpoint_bytes: AtomicU64::new(0),
            checkpoint_restores: AtomicU64::new(0),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a metrics lock leaves plain numbers behind: keep using them.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    /// Records the shared prompt cache's block size in positions (0: the cache is off),
    /// which `vllm:cache_config_info` reports to routers that hash prompts by block.
    pub fn set_cache_block(&self, positions: usize) {
        self.cache_block.store(positions, Ordering::Relaxed);
    }

    /// Counts a finished HTTP request by status.
    pub fn request(&self, status: u16) {
        *lock(&self.requests).entry(status).or_insert(0) += 1;
    }

    /// Adds prompt tokens prefilled (or reused) for a request.
    pub fn add_prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Adds prompt tokens run through the model (a kept prefix, or a prompt prefilled
    /// once for several choices, is not run again and not counted again).
    pub fn add_prefilled(&self, n: usize) {
        self.prefill_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Adds one finished request's prompt-processing and generation times.
    pub fn add_phase_times(&self, prompt: Duration, predicted: Duration) {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.prompt_nanos.fetch_add(ns(prompt), Ordering::Relaxed);
        self.predicted_nanos
            .fetch_add(ns(predicted), Ordering::Relaxed);
    }

    /// Counts one engine step over `seqs` sequences.
    pub fn add_decode(&self, seqs: usize) {
        self.decodes.fetch_add(1, Ordering::Relaxed);
        self.decode_seqs.fetch_add(seqs as u64, Ordering::Relaxed);
    }

    /// Moves one model's share of the KV gauges from `before` to `now`, each a pair of
    /// (tokens its slots hold, positions they have): every loaded model's worker adds
    /// its own share, so the gauges cover all of them.
    pub fn move_kv(&self, before: (usize, usize), now: (usize, usize)) {
        let shift = |a: &AtomicUsize, from: usize, to: usize| {
            if to >= from {
                a.fetch_add(to - from, Ordering::Relaxed);
            } else {
                a.fetch_sub(from - to, Ordering::Relaxed);
            }
        };
        shift(&self.kv_tokens, before.0, now.0);
        shift(&self.kv_capacity, before.1, now.1);
    }

    /// Counts prompt tokens whose KV rows were copied from the shared prompt cache.
    pub fn add_cache_hits(&self, n: usize) {
        self.cache_hits.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Sets the bytes of rows the shared prompt cache holds.
    pub fn set_cache_bytes(&self, n: usize) {
        self.cache_bytes.store(n, Ordering::Relaxed);
    }

    /// Sets what the recurrent state checkpoints hold (bytes) and how many prompts went
    /// on from one so far (a hybrid model's slots, `--ctx-checkpoints`).
    pub fn set_checkpoints(&self, bytes: u64, restores: u64) {
        self.checkpoint_bytes.store(bytes, Ordering::Relaxed);
        self.checkpoint_restores.store(restores, Ordering::Relaxed);
    }

    /// Raises the high-water mark of positions one slot has held.
    pub fn observe_slot_tokens(&self, n: usize) {
        self.kv_high.fetch_max(n, Ordering::Relaxed);
    }

    /// Adds the tokens one speculative step drafted and how many of them were accepted
    /// (a step that drafted nothing verified no draft).
    pub fn add_draft(&self, drafted: usize, accepted: usize) {
        self.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
        self.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
        if drafted > 0 {
            self.draft_steps.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Prompt tokens not run again because their rows were at hand: a slot's kept prefix
    /// or the shared prompt cache.
    fn cached_prompt_tokens(&self) -> u64 {
        let prompt = self.prompt_tokens.load(Ordering::Relaxed);
        prompt.saturating_sub(self.prefill_tokens.load(Ordering::Relaxed))
    }

    /// When the counters started, in seconds since the Unix epoch (llama-server's
    /// `Process-Start-Time-Unix` header of `/metrics`).
    pub fn started_unix(&self) -> u64 {
        self.started_unix
    }

    /// Adds `n` speculative blocks whose recurrent state was put back and whose kept
    /// tokens ran again.
    pub fn add_rewinds(&self, n: usize) {
        self.rewinds.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Adds one generated token.
    pub fn add_generated(&self, n: usize) {
        self.generated_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Adds time during which at least one slot was busy.
    pub fn add_busy(&self, d: Duration) {
        self.busy_nanos
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Sets the number of slots serving a request.
    pub fn set_busy_slots(&self, n: usize) {
        self.busy_slots.store(n, Ordering::Relaxed);
    }

    /// Requests waiting for a slot.
    pub fn queue_len(&self) -> usize {
        self.queue_len.load(Ordering::Relaxed)
    }

    /// One more (`+1`) or one fewer (`-1`) request waiting.
    pub fn queue_delta(&self, up: bool) {
        if up {
            self.queue_len.fetch_add(1, Ordering::Relaxed);
        } else {
            self.queue_len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Records a time to first token.
    pub fn observe_ttft(&self, d: Duration) {
        lock(&self.ttft).observe(d.as_secs_f64());
    }

    /// Records the gap between two tokens of one request.
    pub fn observe_itl(&self, d: Duration) {
        lock(&self.itl).observe(d.as_secs_f64());
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str("# HELP minfer_requests_total HTTP requests answered, by status.\n");
        s.push_str("# TYPE minfer_requests_total counter\n");
        for (status, n) in lock(&self.requests).iter() {
            let _ = writeln!(s, "minfer_requests_total{{status=\"{status}\"}} {n}");
        }
        let gen = self.generated_tokens.load(Ordering::Relaxed);
        let busy = self.busy_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let rate = if busy > 0.0 { gen as f64 / busy } else { 0.0 };
        let scalars: [(&str, &str, &str, String); 13] = [
            (
                "minfer_prompt_tokens_total",
                "counter",
                "Prompt tokens of admitted requests.",
                self.prompt_tokens.load(Ordering::Relaxed).to_string(),
            ),
            (
                "minfer_prefill_tokens_total",
                "counter",
                "Prompt tokens run through the model (kept prefixes are not run again).",
                self.prefill_tokens.load(Ordering::Relaxed).to_string(),
            ),
            (
                "minfer_generated_tokens_total",
                "counter",
                "Tokens generated.",
                gen.to_string(),
            ),
            (
                "minfer_tokens_per_second",
                "gauge",
                "Generated tokens per second of time with at least one busy slot.",
                format!("{rate:.3}"),
            ),
            (
                "minfer_busy_slots",
                "gauge",
                "Slots serving a request.",
                self.busy_slots.load(Ordering::Relaxed).to_string(),
            ),
            (
                "minfer_queue_length",
                "gauge",
                "Requests waiting for a free slot.",
                self.queue_len().to_string(),
            ),
            (
                "minfer_draft_tokens_total",
                "counter",
                "Tokens drafted by speculative decoding (llama-server's n_draft_total).",
                self.drafted.load(Ordering::Relaxed).to_string(),
            ),
            (
                "minfer_draft_accepted_tokens_total",
                "counter",
                "Drafted tokens the model accepted (llama-server's n_draft_accepted).",
                self.accepted.load(Ordering::Relaxed).to_string(),
            ),
            (
                "minfer_draft_rewinds_total",
                "counter",
                "Speculative blocks of a recurrent model whose state was put back after a rejected draft and whose kept tokens ran again.",
                self.rewinds.load(Ordering::Relaxed).to_string(),
            ),
            (
                "minfer_prompt_cache_hit_tokens_total",
                "counter",
                "Prompt tokens whose KV rows were copied from the shared prompt cache (--cache-ram).",
                self.cache_hits.load(Ordering::Relaxed).to_string(),
            ),
            (
                "minfer_prompt_cache_bytes",
                "gauge",
                "Bytes of KV rows the shared prompt cache holds.",
                self.cache_bytes.load(Ordering::Relaxed).to_string(),
            ),
            (
                "minfer_ctx_checkpoint_bytes",
                "gauge",
                "Bytes of recurrent state checkpoints the slots hold (--ctx-checkpoints).",
                self.checkpoint_bytes.load(Ordering::Relaxed).to_string(),
            ),
            (
                "minfer_ctx_checkpoint_restores_total",
                "counter",
                "Prompts that went on from a recurrent state checkpoint instead of position 0.",
                self.checkpoint_restores.load(Ordering::Relaxed).to_string(),
            ),
        ];
        for (name, kind, help, value) in scalars {
            let _ = writeln!(
                s,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        lock(&self.ttft).render(
            &mut s,
            "minfer_time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
        );
        lock(&self.itl).render(
            &mut s,
            "minfer_inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request.",
        );
        self.render_llamacpp(&mut s, gen);
        self.render_vllm(&mut s, gen);
        s
    }

    /// llama-server's metrics under its own names, so that its dashboards and alerts
    /// work unchanged.
    fn render_llamacpp(&self, s: &mut String, gen: u64) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // llama-server counts the prompt tokens it ran, which is minfer's prefill count.
        let prompt_n = get(&self.prefill_tokens);
        let prompt_secs = get(&self.prompt_nanos) as f64 / 1e9;
        let predicted_secs = get(&self.predicted_nanos) as f64 / 1e9;
        let decodes = get(&self.decodes);
        let ratio = |num: f64, den: f64| if den > 0.0 { num / den } else { 0.0 };
        let kv_tokens = self.kv_tokens.load(Ordering::Relaxed);
        let kv_capacity = self.kv_capacity.load(Ordering::Relaxed);
        let cached = self.cached_prompt_tokens();
        let rows: [(&str, &str, &str, String); 16] = [
            (
                "prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed, excluding cached tokens.",
                prompt_n.to_string(),
            ),
            (
                "prompt_tokens_cached_total",
                "counter",
                "Number of prompt tokens reused from the cache.",
                cached.to_string(),
            ),
            (
                "prompt_seconds_total",
                "counter",
                "Prompt process time in seconds.",
                format!("{prompt_secs:.6}"),
            ),
            (
                "tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                gen.to_string(),
            ),
            (
                "tokens_predicted_seconds_total",
                "counter",
                "Predict process time in seconds.",
                format!("{predicted_secs:.6}"),
            ),
            (
                "n_decode_total",
                "counter",
                "Total number of engine steps.",
                decodes.to_string(),
            ),
            (
                "n_busy_slots_per_decode",
                "gauge",
                "Average number of busy slots per engine step.",
                format!(
                    "{:.3}",
                    ratio(get(&self.decode_seqs) as f64, decodes as f64)
                ),
            ),
            (
                "prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s.",
                format!("{:.3}", ratio(prompt_n as f64, prompt_secs)),
            ),
            (
                "predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                format!("{:.3}", ratio(gen as f64, predicted_secs)),
            ),
            (
                "requests_processing",
                "gauge",
                "Number of requests processing.",
                self.busy_slots.load(Ordering::Relaxed).to_string(),
            ),
            (
                "requests_deferred",
                "gauge",
                "Number of requests deferred.",
                self.queue_len().to_string(),
            ),
            (
                "n_tokens_max",
                "counter",
                "High watermark of the context size observed.",
                self.kv_high.load(Ordering::Relaxed).to_string(),
            ),
            (
                "spec_decode_num_draft_tokens_total",
                "counter",
                "Speculative: Total draft tokens generated.",
                get(&self.drafted).to_string(),
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "counter",
                "Speculative: Total draft tokens accepted by the target model.",
                get(&self.accepted).to_string(),
            ),
            (
                "spec_decode_num_drafts_total",
                "counter",
                "Speculative: Total speculative decoding verification steps.",
                get(&self.draft_steps).to_string(),
            ),
            (
                "kv_cache_usage_ratio",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                format!("{:.6}", ratio(kv_tokens as f64, kv_capacity as f64)),
            ),
        ];
        for (name, kind, help, value) in rows {
            let _ = writeln!(
                s,
                "# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}"
            );
        }
        let _ = writeln!(
            s,
            "# HELP llamacpp:kv_cache_tokens KV-cache tokens.\n\
             # TYPE llamacpp:kv_cache_tokens gauge\nllamacpp:kv_cache_tokens {kv_tokens}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(7.0);
        let mut s = String::new();
        h.render(&mut s, "x", "help");
        assert!(s.contains("x_bucket{le=\"0.1\"} 1\n"));
        assert!(s.contains("x_bucket{le=\"1\"} 2\n"));
        assert!(s.contains("x_bucket{le=\"+Inf\"} 3\n"));
        assert!(s.contains("x_count 3\n"));
    }

    #[test]
    fn render_reports_counters_and_rate() {
        let m = Metrics::default();
        m.request(200);
        m.request(200);
        m.add_generated(10);
        m.add_prefilled(7);
        m.add_busy(Duration::from_secs(2));
        let s = m.render();
        assert!(
            s.contains("minfer_requests_total{status=\"200\"} 2\n"),
            "{s}"
        );
        assert!(s.contains("minfer_tokens_per_second 5.000\n"), "{s}");
        assert!(s.contains("minfer_prefill_tokens_total 7\n"), "{s}");
    }

    #[test]
    fn llama_server_names_carry_the_same_information() {
        let m = Metrics::default();
        m.add_prompt_tokens(12);
        m.add_prefilled(8);
        m.add_generated(10);
        m.add_phase_times(Duration::from_millis(500), Duration::from_secs(2));
        m.add_decode(1);
        m.add_decode(3);
        m.set_busy_slots(2);
        m.queue_delta(true);
        m.move_kv((0, 0), (70, 256));
        m.move_kv((70, 256), (64, 256));
        m.observe_slot_tokens(40);
        m.observe_slot_tokens(30);
        m.add_draft(5, 3);
        m.add_draft(0, 0);
        m.add_draft(2, 2);
        let s = m.render();
        for line in [
            "llamacpp:prompt_tokens_total 8\n",
            "llamacpp:prompt_tokens_cached_total 4\n",
            "llamacpp:spec_decode_num_draft_tokens_total 7\n",
            "llamacpp:spec_decode_num_accepted_tokens_total 5\n",
            "llamacpp:spec_decode_num_drafts_total 2\n",
            "llamacpp:prompt_seconds_total 0.500000\n",
            "llamacpp:tokens_predicted_total 10\n",
            "llamacpp:tokens_predicted_seconds_total 2.000000\n",
            "llamacpp:n_decode_total 2\n",
            "llamacpp:n_busy_slots_per_decode 2.000\n",
            "llamacpp:prompt_tokens_seconds 16.000\n",
            "llamacpp:predicted_tokens_seconds 5.000\n",
            "llamacpp:requests_processing 2\n",
            "llamacpp:requests_deferred 1\n",
            "llamacpp:n_tokens_max 40\n",
            "llamacpp:kv_cache_usage_ratio 0.250000\n",
            "llamacpp:kv_cache_tokens 64\n",
            "# TYPE llamacpp:prompt_tokens_total counter\n",
            "# TYPE llamacpp:requests_processing gauge\n",
        ] {
            assert!(s.contains(line), "missing {line:?} in\n{s}");
        }
        // The existing names stay, with their own meaning (every prompt token).
        assert!(s.contains("minfer_prompt_tokens_total 12\n"), "{s}");
    }
}
