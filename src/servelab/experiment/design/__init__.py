"""The experiment's design as its file states it: arms over a base, load points and sweeps,
repetitions and order, placement keys, and the metrics it may decide on; parsed from a file or
read back from a store into one typed model. The bottom of experiment/: imports nothing else of
it. (Named design/, not spec/: tools read a folder spec/ as tests.)"""
