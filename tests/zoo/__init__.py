"""The model zoo: real model families written the way their libraries' own examples
write them, used as the yardstick for sowviz on programs nobody here wrote."""
