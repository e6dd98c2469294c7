"""The training-time monitor: [`Watch`][isiwatch.Watch], its samples, alerts, stopping rule, config
file and exporters."""
