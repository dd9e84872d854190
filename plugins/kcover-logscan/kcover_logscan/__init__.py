"""kcover detector that classifies failed training containers from the tail of their logs."""
