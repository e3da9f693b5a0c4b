"""The extender's verbs around a decision: /filter's service, /bind, /prioritize (with the second
fit at /bind), /preempt, /refit, one lock per pod, and the cleanup of a void decision."""
