package reconcile

// KeyBucket is keyBucket, for tests that need keys sharing a bucket.
var KeyBucket = keyBucket
