//! Token buckets per topic for publishes. Pure: the caller passes `now_ms`; refill is
//! computed from elapsed time in integer milli-tokens so the answer is exact and repeatable.

use std::collections::BTreeMap;

use crate::types::{Millis, TopicName};

/// A rule as an operator sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateRule {
    pub events_per_second: u64,
    pub burst: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RateRuleError {
    ZeroRate,
    ZeroBurst,
    TooLarge,
    TooManyRules { max: usize },
}

impl std::fmt::Display for RateRuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RateRuleError::ZeroRate => write!(f, "eventsPerSecond must be at least 1"),
            RateRuleError::ZeroBurst => write!(f, "burst must be at least 1"),
            RateRuleError::TooLarge => write!(f, "eventsPerSecond and burst must be at most 10^9"),
            RateRuleError::TooManyRules { max } => write!(f, "at most {max} rate rules"),
        }
    }
}

const MAX_RATE: u64 = 1_000_000_000;

#[derive(Clone, Debug)]
struct Bucket {
    rule: RateRule,
    /// Thousandths of a token, so a refill of one event per 1000 ms per token stays exact.
    milli_tokens: u64,
    last_ms: Millis,
}

/// Rate limits per topic; topics without a rule are not limited.
#[derive(Clone, Debug)]
pub struct RateLimiter {
    buckets: BTreeMap<TopicName, Bucket>,
    max_rules: usize,
}

impl RateLimiter {
    pub fn new(max_rules: usize) -> Self {
        Self {
            buckets: BTreeMap::new(),
            max_rules,
        }
    }

    /// Sets or replaces the rule of a topic; the bucket starts full.
    pub fn set_rule(
        &mut self,
        now_ms: Millis,
        topic: TopicName,
        rule: RateRule,
    ) -> Result<(), RateRuleError> {
        if rule.events_per_second == 0 {
            return Err(RateRuleError::ZeroRate);
        }
        if rule.burst == 0 {
            return Err(RateRuleError::ZeroBurst);
        }
        if rule.events_per_second > MAX_RATE || rule.burst > MAX_RATE {
            return Err(RateRuleError::TooLarge);
        }
        if !self.buckets.contains_key(&topic) && self.buckets.len() >= self.max_rules {
            return Err(RateRuleError::TooManyRules {
                max: self.max_rules,
            });
        }
        self.buckets.insert(
            topic,
            Bucket {
                rule,
                milli_tokens: rule.burst * 1000,
                last_ms: now_ms,
            },
        );
        Ok(())
    }

    pub fn remove_rule(&mut self, topic: &TopicName) -> bool {
        self.buckets.remove(topic).is_some()
    }

    pub fn rules(&self) -> impl Iterator<Item = (&TopicName, RateRule)> {
        self.buckets.iter().map(|(t, b)| (t, b.rule))
    }

    /// Takes `n` tokens for `topic`, all or nothing. `Err(retry_after_ms)` says when `n`
    /// tokens will be there (or `None` if `n` exceeds the burst and never will be).
    pub fn try_acquire(
        &mut self,
        now_ms: Millis,
        topic: &TopicName,
        n: u64,
    ) -> Result<(), Option<Millis>> {
        let Some(b) = self.buckets.get_mut(topic) else {
            return Ok(());
        };
        let elapsed_ms = now_ms.saturating_sub(b.last_ms);
        b.last_ms = b.last_ms.max(now_ms);
        let cap = b.rule.burst * 1000;
        // events/s * ms = milli-events; saturating so a long idle cannot overflow.
        let refill = b.rule.events_per_second.saturating_mul(elapsed_ms);
        b.milli_tokens = b.milli_tokens.saturating_add(refill).min(cap);
        let want = n.saturating_mul(1000);
        if want > cap {
            return Err(None);
        }
        if b.milli_tokens >= want {
            b.milli_tokens -= want;
            return Ok(());
        }
        let missing = want - b.milli_tokens;
        Err(Some(missing.div_ceil(b.rule.events_per_second)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic() -> TopicName {
        TopicName::new("t").unwrap()
    }

    #[test]
    fn unlimited_without_a_rule() {
        let mut r = RateLimiter::new(4);
        assert_eq!(r.try_acquire(0, &topic(), 1_000_000), Ok(()));
    }

    #[test]
    fn burst_then_refill_at_the_rate() {
        let mut r = RateLimiter::new(4);
        r.set_rule(
            0,
            topic(),
            RateRule {
                events_per_second: 10,
                burst: 5,
            },
        )
        .unwrap();
        for _ in 0..5 {
            assert_eq!(r.try_acquire(0, &topic(), 1), Ok(()));
        }
        assert_eq!(r.try_acquire(0, &topic(), 1), Err(Some(100)));
        assert_eq!(r.try_acquire(99, &topic(), 1), Err(Some(1)));
        assert_eq!(r.try_acquire(100, &topic(), 1), Ok(()));
        // Refill never exceeds the burst, however long the idle.
        assert_eq!(r.try_acquire(1_000_000, &topic(), 6), Err(None));
        assert_eq!(r.try_acquire(1_000_000, &topic(), 5), Ok(()));
    }

    #[test]
    fn bad_rules_are_refused() {
        let mut r = RateLimiter::new(1);
        assert_eq!(
            r.set_rule(
                0,
                topic(),
                RateRule {
                    events_per_second: 0,
                    burst: 1
                }
            ),
            Err(RateRuleError::ZeroRate)
        );
        assert_eq!(
            r.set_rule(
                0,
                topic(),
                RateRule {
                    events_per_second: 1,
                    burst: 0
                }
            ),
            Err(RateRuleError::ZeroBurst)
        );
        r.set_rule(
            0,
            topic(),
            RateRule {
                events_per_second: 1,
                burst: 1,
            },
        )
        .unwrap();
        assert_eq!(
            r.set_rule(
                0,
                TopicName::new("u").unwrap(),
                RateRule {
                    events_per_second: 1,
                    burst: 1
                }
            ),
            Err(RateRuleError::TooManyRules { max: 1 })
        );
    }
}
