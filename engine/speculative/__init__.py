"""Speculative decoding without a draft model: proposers that guess a request's next tokens from
text already seen (its own prompt and output; recent requests' outputs), and the rules that
accept a guess only where the target model agrees (greedy) or in proportion to the target's own
probability (sampling), so the output is the one decoding without speculation gives, token for
token or in distribution."""
