"""The mutating webhook's rules: which pods this scheduler takes, what they may ask for, and
which annotations only the scheduler and the device plugins may write."""
