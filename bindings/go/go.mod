module libte.org/te

go 1.19
