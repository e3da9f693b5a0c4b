"""Room made for a pod by evicting others: device preemption's victim search and evictions, and
the holds that keep the freed devices for the pod (preemption's and the defragmenter's)."""
