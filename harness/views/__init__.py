"""The run's views: report.html with its figures and charts, and the views written after the run loop."""
