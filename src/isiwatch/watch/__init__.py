"""The training-time monitor: :class:`~isiwatch.watch.monitor.Watch`, its samples, alerts, stopping rule, config
file and exporters."""
