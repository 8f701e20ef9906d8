package worker

// RecordEvery is recordEvery, for the recoverer's tests.
const RecordEvery = recordEvery
