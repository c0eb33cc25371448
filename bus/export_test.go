package bus

// OpenWith is openWith for the tests of package bus_test.
var OpenWith = openWith
