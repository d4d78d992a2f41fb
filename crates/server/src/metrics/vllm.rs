//! The same numbers under vLLM's metric names and meanings, which gateways in front of
//! model servers read to route (the Gateway API Inference Extension's model-server
//! protocol: queued requests and KV-cache utilisation; SMG and other routers: running
//! requests, prefix-cache hits, token counters and latency histograms).

use std::fmt::Write;
use std::sync::atomic::Ordering;

use super::{lock, Metrics};

impl Metrics {
    /// Appends the `vllm:*` exposition to `s`: one model per server process, as vLLM.
    pub(super) fn render_vllm(&self, s: &mut String, gen: u64) {
        let queries = self.prompt_tokens.load(Ordering::Relaxed);
        let hits = self.cached_prompt_tokens();
        let kv_tokens = self.kv_tokens.load(Ordering::Relaxed) as f64;
        let kv_capacity = self.kv_capacity.load(Ordering::Relaxed) as f64;
        let usage = if kv_capacity > 0.0 {
            kv_tokens / kv_capacity
        } else {
            0.0
        };
        let rows: [(&str, &str, &str, String); 8] = [
            (
                "num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                self.busy_slots.load(Ordering::Relaxed).to_string(),
            ),
            (
                "num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                self.queue_len().to_string(),
            ),
            (
                "kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                format!("{usage:.6}"),
            ),
            (
                "gpu_cache_usage_perc",
                "gauge",
                "KV-cache usage (the older name of kv_cache_usage_perc). 1 means 100 percent usage.",
                format!("{usage:.6}"),
            ),
            (
                "prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in prompt tokens.",
                queries.to_string(),
            ),
            (
                "prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in prompt tokens whose KV was reused.",
                hits.to_string(),
            ),
            (
                "prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                queries.to_string(),
            ),
            (
                "generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                gen.to_string(),
            ),
        ];
        for (name, kind, help, value) in rows {
            let _ = writeln!(
                s,
                "# HELP vllm:{name} {help}\n# TYPE vllm:{name} {kind}\nvllm:{name} {value}"
            );
        }
        lock(&self.ttft).render(
            s,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
        );
        lock(&self.itl).render(
            s,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
        );
        // Prompts are reused across requests in whole blocks of the shared prompt cache;
        // without it a slot reuses its own rows token by token, a block of one.
        let block = self.cache_block.load(Ordering::Relaxed).max(1);
        let _ = writeln!(
            s,
            "# HELP vllm:cache_config_info Information of the KV cache configuration.\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"{block}\",enable_prefix_caching=\"True\",num_gpu_blocks=\"{}\"}} 1",
            kv_capacity as u64 / block as u64
        );
        // No LoRA adapters: the gauge says so (its value is when it was last updated),
        // for routers that read it to pick servers.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let _ = writeln!(
            s,
            "# HELP vllm:lora_requests_info Running stats on LoRA requests.\n\
             # TYPE vllm:lora_requests_info gauge\n\
             vllm:lora_requests_info{{max_lora=\"0\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"}} {now:.3}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_names_carry_the_queue_the_kv_usage_and_the_prefix_hits() {
        let m = Metrics::default();
        m.add_prompt_tokens(10);
        m.add_prefilled(4);
        m.add_generated(3);
        m.queue_delta(true);
        m.set_busy_slots(2);
        m.move_kv((0, 0), (16, 64));
        m.observe_ttft(std::time::Duration::from_millis(30));
        let s = m.render();
        for want in [
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1\n",
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n",
            "vllm:kv_cache_usage_perc 0.250000\n",
            "vllm:gpu_cache_usage_perc 0.250000\n",
            "# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total 10\n",
            "vllm:prefix_cache_hits_total 6\n",
            "vllm:prompt_tokens_total 10\n",
            "vllm:generation_tokens_total 3\n",
            "# TYPE vllm:time_to_first_token_seconds histogram\n",
            "vllm:time_to_first_token_seconds_count 1\n",
            "vllm:cache_config_info{block_size=\"1\",enable_prefix_caching=\"True\",num_gpu_blocks=\"64\"} 1\n",
            "# TYPE vllm:lora_requests_info gauge\n",
        ] {
            assert!(s.contains(want), "missing {want:?} in\n{s}");
        }
        // With the shared prompt cache on, a block is one of its blocks.
        m.set_cache_block(16);
        assert!(m.render().contains(
            "vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\",num_gpu_blocks=\"4\"} 1\n"
        ));
    }
}
