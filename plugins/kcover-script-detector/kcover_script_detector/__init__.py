"""kcover detector that runs node check scripts with node-problem-detector's custom-plugin protocol."""
