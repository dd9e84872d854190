"""kcover-preflight: catch slow and broken nodes before a training job spends hours on them."""
